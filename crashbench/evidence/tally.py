"""From one crash run's timeline to its DesignRun: the evidence checks, the counts, the timings.

The timeline (crashbench.model.timeline) is everything the run recorded: the ledgers' executions, the
harness's reading of Redis, the design's own report, the faults, the workers, the enqueues. Nothing
is computed from anything else, so a saved timeline gives the same result again (`crashbench recount`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from crashbench import jobids
from crashbench.errors import UnexpectedError
from crashbench.evidence import checks as evidence
from crashbench.evidence import counts as counting
from crashbench.evidence import signaled
from crashbench.evidence import trim as trimming
from crashbench.evidence.checker import Checker, History, Section, Sections, checker, compose, crashed, merged_counts
from crashbench.evidence.delays import delays as _delays
from crashbench.evidence.effects import effects as _effects
from crashbench.model.counts import Counts
from crashbench.model.executions import EMPTY_ACK, FAILED, Execution, Executions
from crashbench.model.faults import JOB_SAMPLE
from crashbench.model.results import DesignRun, SignalRecord, Timings
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None for none."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


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


@checker("signals")
def _signals(h: History, before: Sections) -> Section:
    """Each worker signal's verdict settled from the final ledger (crashbench.evidence.signaled): on copies, so the
    timeline stays as recorded; the later checkers fill in their derived figures."""
    return Section("signals", facts={"records": signaled.settle(h.timeline.signals, h.runs)})  # counted in outcomes


@checker("evidence")
def _evidence(h: History, before: Sections) -> Section:
    """The sources that are produced independently, compared (crashbench.evidence.checks); and where the
    harness's search and the design's reading disagreed."""
    tl, produced = h.timeline, h.timeline.produced
    # A parent-only kill leaves the job running in an orphan, which may finish it: no claim to check.
    # The claims are the injector's own look, as recorded.
    facts = [evidence.SignalFact(k.worker, k.signal, k.mid_job, k.job) for k in tl.signals if k.target != "parent"]
    problems = evidence.check(
        evidence.Evidence(
            enqueued=tl.ids, executions=tl.executions, located=tl.located, state=tl.state,
            drained=tl.drained, own_worker=tl.design.own_worker, signals=facts, ledger_problems=tl.ledger_problems,
            acknowledged=tl.acknowledged if produced else None,
            indeterminate=tl.indeterminate if produced else None,
            drained_at=tl.drained_at, settled_at=tl.settled_at, backlog_after=tl.backlog_after,
            held_at_drain=tl.held_at_drain,
        )
    )  # fmt: skip
    return Section("evidence", problems=problems + list(tl.reading_problems))


@checker("outcomes")
def _outcomes(h: History, before: Sections) -> Section:
    """Every enqueued job in exactly one outcome class, and the events around them
    (crashbench.evidence.counts)."""
    tl, sc = h.timeline, h.scenario
    c, classes = counting.count(
        tl.ids, tl.executions, tl.located, tl.state, drops_failed=tl.design.drops_failed,
        kills=len(records := before.fact("signals", "records")), kills_mid_job=sum(k.mid_job for k in records),
        workload=sc.workload_model(), settings=sc.settings(), indeterminate=tl.indeterminate,
        broker_fault=tl.fault_window(), drained=tl.drained, cut_off=tl.cut_off,
    )  # fmt: skip
    c.worker_crashes = len(tl.exits)
    c.empty_acks = sum(1 for f in h.runs.flags if f & EMPTY_ACK)
    c.consumers = len(tl.located.consumers)
    jobs = {
        k: sorted(classes[k])[:JOB_SAMPLE]
        for k in ("lost", "stranded", "undrained", "dead_lettered", "failed", "unconfirmed", "library_disagrees")
    }
    if classes["taken_by_stop"]:  # only where the stop took any (and never in a result from before the count)
        jobs["taken_by_stop"] = sorted(classes["taken_by_stop"])[:JOB_SAMPLE]
    counts = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
    return Section("outcomes", counts=counts, jobs=jobs, facts={"classes": classes, "counts": c})


@checker("requeues")
def _requeues(h: History, before: Sections) -> Section:
    """The design's own word on what recovery gave back, against the ledger's redeliveries."""
    tl, c, classes = h.timeline, before.fact("outcomes", "counts"), before.fact("outcomes", "classes")
    return Section(
        "requeues",
        problems=evidence.requeues(tl.state, tl.ids, h.runs, tl.located, _redelivery(tl, h.scenario, c, classes)),
    )


@checker("trim")
def _trim(h: History, before: Sections) -> Section:
    """Which lost jobs a trimmed stream no longer holds (crashbench.evidence.trim)."""
    trim = trimming.trimmed(h.timeline, before.fact("outcomes", "classes")["lost"])
    if trim is None:  # only where receipts were kept: a result saved before them recounts to the same ids
        return Section("trim")
    counts = {"trimmed_unread": len(trim.unread), "trimmed_pending": len(trim.pending)}
    counts["trimmed"] = counts["trimmed_unread"] + counts["trimmed_pending"]
    jobs = {"trimmed_unread": sorted(trim.unread)[:JOB_SAMPLE], "trimmed_pending": sorted(trim.pending)[:JOB_SAMPLE]}
    return Section("trim", counts=counts, jobs=jobs)


@checker("recovery")
def _recovery(h: History, before: Sections) -> Section:
    """How soon each killed worker's replacement was ready and its jobs ran again; the jobs that never did."""
    tl, records = h.timeline, before.fact("signals", "records")
    runs_of = _runs_of(h.runs, {j for k in records for j in k.jobs})
    for k in records:
        ready = tl.ready.get(k.replacement) if k.replacement else None
        if ready is not None:
            k.replacement_ready_ms = round((ready - k.at) * 1000, 3)
        k.recovered_after_ms = signaled.recovery_ms(k, runs_of.get(k.job or "", []))
    recoveries = sorted(k.recovered_after_ms for k in records if k.recovered_after_ms is not None)
    # Every handler a kill interrupted, not only the one its record names: a worker running several
    # (threads, a pool) leaves several jobs for recovery to give back.
    unrecovered = sum(1 for k in records for j in k.jobs if math.isinf(signaled.recovery_ms(k, runs_of[j]) or 0.0))
    return Section("recovery", counts={"unrecovered": unrecovered}, facts={"recoveries": recoveries})


# The core checkers; each fault family adds its own after them (crashbench.faults.registry.checkers).
CHECKERS: tuple[Checker, ...] = (_signals, _evidence, _outcomes, _requeues, _trim, _recovery, _effects, _delays)


def design_run(tl: Timeline, checkers: Sequence[Checker]) -> DesignRun:
    """The run's result from its timeline alone: its checkers composed (crashbench.evidence.checker; the
    run's are crashbench.faults.registry.checkers(): the core ones and every fault family's). A
    checker that raised leaves its verdict unknown: the others still ran, and the run ends with its
    error (exit 5), never with counts it did not check."""
    h = History.of(tl)
    sections = compose(checkers, h)
    if failed := crashed(sections):
        raise UnexpectedError("; ".join(f"checker {s.name} raised, its verdict is unknown: {s.error}" for s in failed))
    c = merged_counts(sections)
    records = sections.fact("signals", "records")
    classes = sections.fact("outcomes", "classes")
    run = DesignRun(
        design=tl.spec,
        variant=tl.variant,
        prefix=tl.prefix,
        seed=h.scenario.faults.seed,
        counts=c,
        timings=_timings(tl, h.scenario, records, c.done, sections.fact("recovery", "recoveries"), _lateness(sections)),
        kills=records,
        network_faults=list(tl.network),
        repeat=tl.repeat,
        schedule=tl.planned,
        broker_fault=tl.broker_fault,
        worker_exits=tl.exits,
        duplicates=_duplicates(h.runs, classes["duplicated"]),
        workdir=tl.workdir,
        jobs={k: v for s in sections.values() for k, v in s.jobs.items()},
        problems=[p for s in sections.values() for p in s.problems],
        total_queue=counting.total_queue(c, tl.design.exactly_once),
        configuration=tl.configuration,
        warnings=tl.warnings,
        consumers=list(tl.located.consumers),
        timeline=tl,
    )
    # What a family's checker settled of its own records (a network fault's liveness) replaces them.
    return dataclasses.replace(run, **{k: v for s in sections.values() for k, v in s.fields.items()})


def _redelivery(tl: Timeline, sc: Scenario, c: Counts, classes: dict) -> evidence.Redelivery:
    # A family's event that names the worker slots it struck (a host's crash, pause or partition) is a
    # fault on each of them: a worker cut off mid-fetch leaves the job the server moved to it to recovery.
    struck = [e for e in tl.fault_events if isinstance(e.data.get("slots"), list) and e.data["slots"]]
    times = [k.at for k in tl.signals] + [nf.at for nf in tl.network] + [e.t for e in struck]
    if tl.broker_fault is not None:
        times.append(tl.broker_fault.at)
    faults = len(tl.signals) + sum(max(1, len(nf.slots)) for nf in tl.network)
    faults += sum(len(e.data["slots"]) for e in struck)
    faults += sc.workload.workers if tl.broker_fault is not None else 0
    return evidence.Redelivery(
        redelivered=classes["redelivered"],
        redeliveries=c.redeliveries,
        first_fault=min(times, default=math.inf),
        faults=faults,
        batch=sc.settings().batch_size,
        counts_requeues=tl.design.counts_requeues,
        broker_fault=tl.broker_fault is not None,
    )


def _lateness(sections: Sections) -> list[float]:
    """The delayed jobs' lateness, sorted (crashbench.evidence.delays); none where the checker was not run."""
    return sections["delays"].facts.get("lateness", []) if "delays" in sections else []


def _timings(
    tl: Timeline, sc: Scenario, signals: list[SignalRecord], done: int, recoveries: list[float], late: list[float]
) -> Timings:
    startups = [(ready - s.t) * 1000 for s in tl.spawns if (ready := tl.ready.get(s.worker)) is not None]
    restarts = [k.replacement_ready_ms for k in signals if k.replacement_ready_ms is not None]
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
        delay_lateness_ms_p50=percentile(late, 0.50),
        delay_lateness_ms_p95=percentile(late, 0.95),
        delay_lateness_ms_max=late[-1] if late else None,
        cut_off=tl.cut_off,
    )
