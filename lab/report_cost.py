"""What the HTML report costs: its size and render time for a run of 2,000 executions (one bar each)
and of 1,000,000 (drawn aggregated), on synthetic timelines; median of 3 renders. The timelines are
built here rather than measured: a million-job crash run takes minutes, rendering it should not."""

from __future__ import annotations

import statistics
import sys
import time

from crashbench.model.faults import SignalRecord
from crashbench.model.ledger import Execution
from crashbench.model.results import Environment, Result
from crashbench.model.timeline import Depth, DesignFlags, Mark, Spawn, Timeline
from crashbench.report import html

SIZES = (2_000, 1_000_000)
WORKERS = 4
KILLS = 5
REPEATS = 3


def timeline(executions: int, job_s: float = 0.01) -> Timeline:
    """`executions` jobs of `job_s` over WORKERS slots, KILLS mid-job kills each followed a second
    later by the hit job's re-run on the next slot, depth read every 0.25 s."""
    tl = Timeline(
        index=0, spec="reliable", variant="", prefix="cost:", repeat=0,
        scenario={"name": "cost", "workers": WORKERS, "jobs": executions, "pause": 1.0}, design=DesignFlags(),
        t0=0.0, started=0.0, window=30.0,
    )  # fmt: skip
    per = executions // WORKERS
    tl.spawns = [Spawn(0.0, f"w{s}", s, 1000 + s) for s in range(WORKERS)]
    tl.executions = [
        Execution(f"{n * WORKERS + s:07d}", f"w{s}", n * job_s, n * job_s + job_s * 0.95, False, 1000 + s, 1)
        for s in range(WORKERS)
        for n in range(per)
    ]
    end = per * job_s
    for i in range(KILLS):
        slot, n = i % WORKERS, per * (i + 1) // (KILLS + 2)
        victim = tl.executions[slot * per + n]
        at = victim.start + job_s / 2
        tl.executions[slot * per + n] = Execution(victim.job, victim.worker, victim.start, None, False, victim.pid, 1)
        rerun = at + 1.0
        tl.executions.append(Execution(victim.job, f"w{(slot + 1) % WORKERS}", rerun, rerun + job_s, False, 0, 2))
        tl.signals.append(SignalRecord(i, at, at, slot, victim.worker, victim.pid, "SIGKILL", "worker", True,
                                   victim.job, 0.0, None, jobs=[victim.job]))  # fmt: skip
        tl.marks.append(Mark(rerun - 0.01, "recover", 1))
    steps = int(end / 0.25) + 1
    tl.depth = [
        Depth(i * 0.25, max(0, executions - int(i * 0.25 / job_s) * WORKERS), WORKERS, 0, 0) for i in range(steps)
    ]
    tl.drained_at = tl.faults_end = end
    tl.drained = True
    return tl


def result() -> Result:
    env = Environment("bench", sys.version.split()[0], "-", sys.platform, "bench", 1, "-", "-", None, "-", None, None)
    return Result("report-cost", "run", "-", {"name": "cost", "workers": WORKERS}, "-", [], env)


def main() -> int:
    print(f"{'executions':>12} {'bytes':>12} {'render s (median of 3)':>24}")
    for n in SIZES:
        tl = timeline(n)
        times, size = [], 0
        for _ in range(REPEATS):
            started = time.perf_counter()
            text = html.render(result(), [tl])
            times.append(time.perf_counter() - started)
            size = len(text.encode())
        print(f"{n:>12,} {size:>12,} {statistics.median(times):>24.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
