"""A worker fault's verdict, settled from the victim's final ledger and the handlers' own times.

The injector freezes its victim (SIGSTOP, checked stopped by the kernel) before it reads the fault's
time and delivers the signal (crashbench.faults.injector), so at that time the victim's handlers
can neither start nor end. A handler's start and end are the times the handler itself took
(crashbench.model.ledger), not when their records were written. So the fault caught exactly the
executions of the victim that had started by the fault's time and had not ended by it; one that
never ended at all is one the victim died inside (its ledger, read after every writer is gone, is
final). This holds for every signal alike: a SIGKILL, another fatal signal, a graceful SIGTERM, a
pause. A handler that returned just before the freeze, its end record written only after the pause,
is not caught: it finished before the fault (issue 25, item 4).

What the injector itself saw (its look at the ledger once the victim was frozen) stays in the
timeline as recorded; crashbench.evidence.checks compares a SIGKILL's look with this reading.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from crashbench.model.executions import Execution, Executions
from crashbench.model.faults import SignalRecord


def caught(kills: Sequence[SignalRecord], runs: Executions) -> list[list[str]]:
    """Per kill, the jobs whose handler it caught, oldest start first: the victim's executions (only
    the process hit, for a child-only kill) that started by the fault's time and had not ended by it.
    One pass over the executions, looking only at the victims' execution contexts."""
    wanted: dict[int, list[int]] = {}  # execution context -> the kills whose victim it is
    for ctx, (worker, pid, _) in enumerate(runs.contexts):
        for i, k in enumerate(kills):
            if worker == k.worker and (not k.child or pid == k.child):
                wanted.setdefault(ctx, []).append(i)
    found: list[list[tuple[float, str]]] = [[] for _ in kills]
    if wanted:
        starts, ends = runs.starts, runs.ends
        for row, ctx in enumerate(runs.ctx):
            mine = wanted.get(ctx)
            if mine is None:
                continue
            start, end = starts[row], ends[row]
            for i in mine:
                at = kills[i].at
                if start <= at and (end != end or end > at):  # NaN: never ended
                    found[i].append((start, runs.job(row)))
    return [[job for _, job in sorted(f)] for f in found]


def settle(kills: Sequence[SignalRecord], runs: Executions) -> list[SignalRecord]:
    """Copies of `kills` whose mid-job verdict, job and jobs are what `caught` reads."""
    out = []
    for k, jobs in zip(kills, caught(kills, runs), strict=True):
        out.append(dataclasses.replace(k, mid_job=bool(jobs), job=jobs[-1] if jobs else None, jobs=jobs))
    return out


def recovery_ms(k: SignalRecord, runs: Sequence[Execution]) -> float | None:
    """Fault -> the next start of a job the victim was inside (`runs`: that job's executions, one of
    `k.jobs`), by anyone: how long recovery took; +inf when it never started again nor completed after
    the fault (a job the queue never gave back); None when no job was hit or it finished where it was."""
    if k.job is None:
        return None
    at = k.at
    later = [ex.start for ex in runs if ex.start > at]
    if later:
        return round((min(later) - at) * 1000, 3)
    if any(ex.completed and ex.end is not None and ex.end > at for ex in runs):
        return None  # a pause or a graceful stop: the job finished in the execution it was in
    return math.inf
