"""From one crash run's timeline to its DesignRun: the evidence checks, the counts, the timings.

The timeline (crashbench.evidence.timeline) is everything the run recorded: the ledgers' executions, the
harness's reading of Redis, the design's own report, the faults, the workers, the enqueues. Nothing
is computed from anything else, so a saved timeline gives the same result again (`crashbench recount`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Set as AbstractSet

from crashbench import jobids
from crashbench.evidence import checks as evidence
from crashbench.evidence import counts as counting
from crashbench.evidence import kills as killing
from crashbench.evidence import trim as trimming
from crashbench.evidence.executions import EMPTY_ACK, FAILED, Execution, Executions
from crashbench.evidence.timeline import Timeline
from crashbench.model.faults import JOB_SAMPLE, NetworkFaultRecord
from crashbench.report.results import DesignRun, KillRecord, Timings
from crashbench.scenario import Scenario


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None for none."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def liveness(nf: NetworkFaultRecord, tl: Timeline) -> NetworkFaultRecord:
    """What the queue did after a network fault healed, from the ledgers and the harness's readings:
    how soon its slots started a handler again, how soon anything completed, how soon it drained,
    completions per second before, during and after it, and which of its slots never resumed although
    jobs waited (another slot started one, or the harness read pending jobs, after the heal)."""
    if nf.healed_at is None:
        return nf
    healed, slot_of = nf.healed_at, tl.slot_of()
    starts = [(ex.start, slot_of.get(ex.worker)) for ex in tl.executions if ex.start >= healed]

    def after(t: float | None) -> float | None:
        return round((t - healed) * 1000, 3) if t is not None else None

    if nf.target == "producer":  # resumed: its first acknowledged enqueue after the heal
        nf.resume_ms = nf.slowest_resume_ms = after(
            min((e.t for e in tl.enqueues if e.ok and e.t >= healed), default=None)
        )
    else:
        first: dict[int, float] = {}  # each faulted slot's first handler start after the heal
        for t, s in starts:
            if s in nf.slots and (s not in first or t < first[s]):
                first[s] = t
        nf.resume_ms = after(min(first.values(), default=None))
        if nf.target != "replica":
            nf.slot_resume_ms = [after(first.get(s)) for s in nf.slots]
            nf.slowest_resume_ms = after(max(first.values())) if first and len(first) == len(nf.slots) else None
    ends = sorted(ex.end for ex in tl.executions if ex.completed and ex.end is not None and ex.end >= healed)
    nf.progress_ms = round((ends[0] - healed) * 1000, 3) if ends else None
    nf.drained_ms = round((tl.drained_at - healed) * 1000, 3) if tl.drained else None
    waited = any(s not in nf.slots for _, s in starts) or any(d.t >= healed and d.pending for d in tl.depth)
    nf.stuck = [s for s in nf.slots if waited and s not in {s2 for _, s2 in starts}]
    span = max(healed - nf.at, 0.001)
    done = [ex.end for ex in tl.executions if ex.completed and ex.end is not None]
    nf.per_s = [round(sum(1 for t in done if lo <= t < lo + span) / span, 2) for lo in (nf.at - span, nf.at, healed)]
    return nf


def _duplicates(runs: Executions, ids: AbstractSet[str]) -> dict[str, int]:
    """The first JOB_SAMPLE jobs completed more than once, and how many times each."""
    shown = {jobids.code(j) for j in sorted(ids)[:JOB_SAMPLE]}
    times: Counter[int] = Counter()
    if shown:
        for c, end, flags in zip(runs.jobs, runs.ends, runs.flags, strict=True):
            if c in shown and end == end and not flags & FAILED:
                times[c] += 1
    return dict(sorted((jobids.name(c), n) for c, n in times.items()))


def _runs_of(runs: Executions, jobs: set[str]) -> dict[str, list[Execution]]:
    """Every execution of each of `jobs` (the jobs the kills hit: a few), read off the columns."""
    out: dict[str, list[Execution]] = {j: [] for j in jobs}
    codes = {jobids.code(j) for j in jobs}
    if codes:
        for row, c in enumerate(runs.jobs):
            if c in codes:
                ex = runs.row(row)
                out[ex.job].append(ex)
    return out


def design_run(tl: Timeline) -> DesignRun:
    sc = Scenario.from_dict(tl.scenario)
    flags = tl.design
    ids, produced = tl.ids, tl.produced
    runs = Executions.of(tl.executions)
    # A parent-only kill leaves the job running in an orphan, which may finish it: no claim to check.
    # The claims are the injector's own look, as recorded.
    facts = [evidence.KillFact(k.worker, k.signal, k.mid_job, k.job) for k in tl.kills if k.target != "parent"]
    # Each kill's verdict settled from the final ledger (crashbench.evidence.kills); counting fills in
    # the derived figures of each: on copies, so the timeline stays as recorded.
    kill_records = killing.settle(tl.kills, runs)
    problems = evidence.check(
        evidence.Evidence(
            enqueued=ids, executions=tl.executions, located=tl.located, state=tl.state,
            drained=tl.drained, own_worker=flags.own_worker, kills=facts, ledger_problems=tl.ledger_problems,
            acknowledged=tl.acknowledged if produced else None,
            indeterminate=tl.indeterminate if produced else None,
            drained_at=tl.drained_at, settled_at=tl.settled_at, backlog_after=tl.backlog_after,
            held_at_drain=tl.held_at_drain,
        )
    )  # fmt: skip
    problems += tl.reading_problems  # where the harness's search and the design's reading disagreed
    c, classes = counting.count(
        ids,
        tl.executions,
        tl.located,
        tl.state,
        drops_failed=flags.drops_failed,
        kills=len(kill_records),
        kills_mid_job=sum(k.mid_job for k in kill_records),
        workload=sc.workload(),
        settings=sc.settings(),
        indeterminate=tl.indeterminate,
        broker_fault=tl.fault_window(),
        drained=tl.drained,
        cut_off=tl.cut_off,
    )
    c.worker_crashes = len(tl.exits)
    problems += evidence.requeues(tl.state, ids, runs, tl.located, _redelivery(tl, sc, c, classes))
    c.empty_acks = sum(1 for f in runs.flags if f & EMPTY_ACK)
    done = classes["done"]
    c.held_at_fault = sum(1 for j in set(tl.held_at_fault) if j not in done)
    if tl.broker_fault is not None and tl.broker_fault.promoted_held is not None:
        # Acknowledged ones only: an enqueue WAIT did not confirm is indeterminate, not lost, if it is gone.
        promoted, indeterminate = set(tl.held_after_promotion), tl.indeterminate
        c.not_replicated = sum(
            1 for j in set(tl.held_at_fault) if j not in promoted and j not in done and j not in indeterminate
        )
    if produced:
        c.acked_during_lag = sum(1 for j in tl.acked_during_lag if j not in done)
    trim = trimming.trimmed(tl, classes["lost"])
    if trim is not None:
        c.trimmed_unread, c.trimmed_pending = len(trim.unread), len(trim.pending)
        c.trimmed = c.trimmed_unread + c.trimmed_pending
    runs_of = _runs_of(runs, {j for k in kill_records for j in k.jobs})
    for k in kill_records:
        ready = tl.ready.get(k.replacement) if k.replacement else None
        if ready is not None:
            k.replacement_ready_ms = round((ready - k.at) * 1000, 3)
        k.recovered_after_ms = killing.recovery_ms(k, runs_of.get(k.job or "", []))
    recoveries = sorted(k.recovered_after_ms for k in kill_records if k.recovered_after_ms is not None)
    # Every handler a kill interrupted, not only the one its record names: a worker running several
    # (threads, a pool) leaves several jobs for recovery to give back.
    c.unrecovered = sum(
        1 for k in kill_records for j in k.jobs if math.isinf(killing.recovery_ms(k, runs_of[j]) or 0.0)
    )
    network = [liveness(dataclasses.replace(nf, slots=list(nf.slots)), tl) for nf in tl.network]
    c.stuck_workers = len({s for nf in network for s in nf.stuck})
    jobs = {
        k: sorted(classes[k])[:JOB_SAMPLE]
        for k in ("lost", "stranded", "undrained", "dead_lettered", "failed", "unconfirmed", "library_disagrees")
    }
    if classes["taken_by_stop"]:  # only where the stop took any (and never in a result from before the count)
        jobs["taken_by_stop"] = sorted(classes["taken_by_stop"])[:JOB_SAMPLE]
    if trim is not None:  # only where receipts were kept: a result saved before them recounts to the same ids
        jobs |= {
            "trimmed_unread": sorted(trim.unread)[:JOB_SAMPLE],
            "trimmed_pending": sorted(trim.pending)[:JOB_SAMPLE],
        }
    c.consumers = len(tl.located.consumers)
    return DesignRun(
        design=tl.spec,
        variant=tl.variant,
        prefix=tl.prefix,
        seed=sc.seed,
        counts=c,
        timings=_timings(tl, sc, kill_records, c.done, recoveries),
        kills=kill_records,
        network_faults=network,
        repeat=tl.repeat,
        schedule=tl.planned,
        broker_fault=tl.broker_fault,
        worker_exits=tl.exits,
        duplicates=_duplicates(runs, classes["duplicated"]),
        workdir=tl.workdir,
        jobs=jobs,
        problems=problems,
        total_queue=counting.total_queue(c, flags.exactly_once),
        configuration=tl.configuration,
        warnings=tl.warnings,
        consumers=list(tl.located.consumers),
        timeline=tl,
    )


def _redelivery(tl: Timeline, sc: Scenario, c: counting.Counts, classes: dict) -> evidence.Redelivery:
    times = [k.at for k in tl.kills] + [nf.at for nf in tl.network]
    if tl.broker_fault is not None:
        times.append(tl.broker_fault.at)
    faults = len(tl.kills) + sum(max(1, len(nf.slots)) for nf in tl.network)
    faults += sc.workers if tl.broker_fault is not None else 0
    return evidence.Redelivery(
        redelivered=classes["redelivered"],
        redeliveries=c.redeliveries,
        first_fault=min(times, default=math.inf),
        faults=faults,
        batch=sc.settings().batch_size,
        counts_requeues=tl.design.counts_requeues,
        broker_fault=tl.broker_fault is not None,
    )


def _timings(tl: Timeline, sc: Scenario, kills: list[KillRecord], done: int, recoveries: list[float]) -> Timings:
    startups = [(ready - s.t) * 1000 for s in tl.spawns if (ready := tl.ready.get(s.worker)) is not None]
    restarts = [k.replacement_ready_ms for k in kills if k.replacement_ready_ms is not None]
    wall = tl.drained_at
    return Timings(
        wall_s=round(wall, 4),
        jobs_per_s=round(done / wall, 2) if wall > 0 else 0.0,
        # A library worker running several handlers at once: the ideal divides by all of them.
        ideal_s=round(sc.ideal_s / tl.configuration.get("concurrency", 1), 4),
        drained=tl.drained,
        drain_s=round(tl.drained_at - tl.faults_end, 4),
        window_s=tl.window,
        startup_ms_median=round(statistics.median(startups), 3) if startups else 0.0,
        startup_ms_max=round(max(startups), 3) if startups else 0.0,
        restart_ms_median=round(statistics.median(restarts), 3) if restarts else None,
        recovery_ms_p50=percentile(recoveries, 0.50),
        recovery_ms_p95=percentile(recoveries, 0.95),
        recovery_ms_max=recoveries[-1] if recoveries else None,
        inspect_s=round(tl.inspect_s, 4),
        cut_off=tl.cut_off,
    )
