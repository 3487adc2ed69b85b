"""From one crash run's record to its DesignRun: the evidence checks, the counts, the timings.

The runner hands over what it recorded (the ledger, the harness's reading of Redis, the design's own
report, the kills and exits, the producer) and nothing is computed from anything else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from crashbench import counts as counting
from crashbench import evidence
from crashbench.broker import Producer
from crashbench.designs import Design, Located, QueueState
from crashbench.faults import plan_kills
from crashbench.ledger import Execution, Ledger
from crashbench.results import BrokerFaultRecord, DesignRun, KillRecord, Timings, WorkerExit
from crashbench.scenario import Scenario
from crashbench.supervisor import WorkerProcess

JOB_SAMPLE = 100  # ids listed per outcome class in a result; the counts are always complete


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None for none."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


@dataclass(slots=True)
class RunRecord:
    spec: str
    variant: str
    prefix: str
    repeat: int
    scenario: Scenario
    design: type[Design]
    ids: list[str]
    ledger: Ledger
    located: Located  # the harness's reading of Redis after the final recovery pass
    state: QueueState  # the design's own report, checked against `located`
    kills: list[KillRecord]
    exits: list[WorkerExit]
    workers: Sequence[WorkerProcess]
    t0: float
    drained: bool
    drained_at: float
    cut_off: bool  # the drain hit its bound while handlers still started: held jobs are undrained, not stranded
    faults_end: float
    window: float
    producer: Producer | None
    broker_fault: BrokerFaultRecord | None
    fault_window: tuple[float, float] | None  # (struck, server back), harness clock
    held_at_fault: set[str]
    inspect_s: float
    workdir: str | None
    configuration: dict[str, Any] = field(default_factory=dict)  # LibraryDesign.configuration()
    warnings: list[str] = field(default_factory=list)  # LibraryDesign.config_warnings()


def recovery_ms(k: KillRecord, t0: float, runs: Sequence[Execution]) -> float | None:
    """Fault -> the next start of a job the victim was inside (`runs`: that job's executions, one of
    `k.jobs`), by anyone: how long recovery took; +inf when it never started again nor completed after
    the fault (a job the queue never gave back); None when no job was hit or it finished where it was."""
    if k.job is None:
        return None
    at = t0 + k.at
    later = [ex.start for ex in runs if ex.start > at]
    if later:
        return round((min(later) - at) * 1000, 3)
    if any(ex.completed and ex.end is not None and ex.end > at for ex in runs):
        return None  # a pause or a graceful stop: the job finished in the execution it was in
    return math.inf


def design_run(rec: RunRecord) -> DesignRun:
    sc, ledger = rec.scenario, rec.ledger
    # A parent-only kill leaves the job running in an orphan, which may finish it: no claim to check.
    kills = [evidence.KillFact(k.worker, k.signal, k.mid_job, k.job) for k in rec.kills if k.target != "parent"]
    problems = evidence.check(
        evidence.Evidence(
            enqueued=rec.ids, executions=ledger.executions, located=rec.located, state=rec.state,
            drained=rec.drained, own_worker=rec.design.own_worker, kills=kills, ledger_problems=ledger.problems,
            acknowledged=rec.producer.acknowledged if rec.producer else None,
            indeterminate=rec.producer.indeterminate if rec.producer else None,
        )
    )  # fmt: skip
    c, classes = counting.count(
        rec.ids,
        ledger.executions,
        rec.located,
        rec.state,
        drops_failed=rec.design.drops_failed,
        kills=len(rec.kills),
        kills_mid_job=sum(k.mid_job for k in rec.kills),
        workload=sc.workload(),
        settings=sc.settings(),
        indeterminate=rec.producer.indeterminate if rec.producer else (),
        broker_fault=rec.fault_window,
        drained=rec.drained,
        cut_off=rec.cut_off,
    )
    completed = ledger.completed
    c.worker_crashes = len(rec.exits)
    c.held_at_fault = sum(1 for j in rec.held_at_fault if not completed[j])
    if rec.producer is not None:
        c.acked_during_lag = sum(1 for j in rec.producer.acked_during_lag if not completed[j])
    hit = {j for k in rec.kills for j in k.jobs}
    runs_of: dict[str, list[Execution]] = {j: [] for j in hit}
    for ex in ledger.executions:
        if ex.job in runs_of:
            runs_of[ex.job].append(ex)
    for k in rec.kills:
        ready = ledger.ready_at(k.replacement) if k.replacement else None
        if ready is not None:
            k.replacement_ready_ms = round((ready - (rec.t0 + k.at)) * 1000, 3)
        k.recovered_after_ms = recovery_ms(k, rec.t0, runs_of.get(k.job or "", []))
    recoveries = sorted(k.recovered_after_ms for k in rec.kills if k.recovered_after_ms is not None)
    # Every handler a kill interrupted, not only the one its record names: a worker running several
    # (threads, a pool) leaves several jobs for recovery to give back.
    c.unrecovered = sum(1 for k in rec.kills for j in k.jobs if math.isinf(recovery_ms(k, rec.t0, runs_of[j]) or 0.0))
    return DesignRun(
        design=rec.spec,
        variant=rec.variant,
        prefix=rec.prefix,
        seed=sc.seed,
        counts=c,
        timings=_timings(rec, c.done, recoveries),
        kills=rec.kills,
        repeat=rec.repeat,
        schedule=plan_kills(sc),
        broker_fault=rec.broker_fault,
        worker_exits=rec.exits,
        duplicates=dict(sorted((j, n) for j, n in completed.items() if n > 1)[:JOB_SAMPLE]),
        workdir=rec.workdir,
        jobs={
            k: sorted(classes[k])[:JOB_SAMPLE]
            for k in ("lost", "stranded", "undrained", "dead_lettered", "failed", "unconfirmed", "library_disagrees")
        },
        problems=problems,
        total_queue=counting.total_queue(c, rec.design.exactly_once),
        configuration=rec.configuration,
        warnings=rec.warnings,
    )


def _timings(rec: RunRecord, done: int, recoveries: list[float]) -> Timings:
    ledger = rec.ledger
    startups = [(ready - w.spawned_at) * 1000 for w in rec.workers if (ready := ledger.ready_at(w.name)) is not None]
    restarts = [k.replacement_ready_ms for k in rec.kills if k.replacement_ready_ms is not None]
    wall = rec.drained_at - rec.t0
    return Timings(
        wall_s=round(wall, 4),
        jobs_per_s=round(done / wall, 2) if wall > 0 else 0.0,
        # A library worker running several handlers at once: the ideal divides by all of them.
        ideal_s=round(rec.scenario.ideal_s / rec.configuration.get("concurrency", 1), 4),
        drained=rec.drained,
        drain_s=round(rec.drained_at - rec.faults_end, 4),
        window_s=rec.window,
        startup_ms_median=round(statistics.median(startups), 3) if startups else 0.0,
        startup_ms_max=round(max(startups), 3) if startups else 0.0,
        restart_ms_median=round(statistics.median(restarts), 3) if restarts else None,
        recovery_ms_p50=percentile(recoveries, 0.50),
        recovery_ms_p95=percentile(recoveries, 0.95),
        recovery_ms_max=recoveries[-1] if recoveries else None,
        inspect_s=round(rec.inspect_s, 4),
        cut_off=rec.cut_off,
    )
