"""What the network fault proxy costs with no toxic on: jobs/s of the reliable design with its workers
connected directly and through the proxy (a fault that heals 10 ms after the start puts them behind it
and leaves nothing on), 4 workers, no kills; with 0 ms jobs (the queue's own cost, the worst case) and
with the default 10 ms jobs. Median of REPEATS runs each; the ratio is through / direct."""

from __future__ import annotations

import statistics
import sys

from crashbench import scenario
from crashbench.run.session import Options, run_designs

REPEATS = 3
THROUGH = {"kind": "network", "toxic": "latency", "latency": 0, "at": 0.0, "duration": 0.01}


def jobs_per_s(job_ms: float, jobs: int, through: bool) -> float:
    sc = scenario.load("default").with_overrides(job_ms=job_ms, jobs=jobs, kills=0)
    if through:
        sc = sc.with_overrides(schedule=(THROUGH,))
    return run_designs(sc, ["reliable"], Options()).runs[0].timings.jobs_per_s


def main() -> int:
    for job_ms, jobs in ((0.0, 10_000), (10.0, 2_000)):
        direct = statistics.median(jobs_per_s(job_ms, jobs, False) for _ in range(REPEATS))
        through = statistics.median(jobs_per_s(job_ms, jobs, True) for _ in range(REPEATS))
        ratio = through / direct
        print(f"{job_ms:g} ms jobs: {direct:.0f} jobs/s direct, {through:.0f} through the proxy (x{ratio:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
