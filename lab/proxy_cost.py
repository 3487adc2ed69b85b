"""What the network fault proxy costs with no toxic on: `crashbench bench --proxy`'s figure alone (the
reliable design's jobs/s, 4 workers connected directly and through the proxy, 0 ms and 10 ms jobs, the
median of REPEATS measurements each; crashbench.bench.proxy), on a private server."""

from __future__ import annotations

import sys

from crashbench.bench import BenchSettings, run_bench

REPEATS = 3
JOBS = 10_000  # of 0 ms jobs per measurement; a tenth as many of 10 ms ones


def main() -> int:
    settings = BenchSettings(designs=(), jobs=JOBS, repeat=REPEATS, memory_jobs=0, proxy=True)
    for c in run_bench(settings).proxy:
        d, t = c.direct, c.through
        print(
            f"{c.job_ms:g} ms jobs: {d.median:.0f} jobs/s direct, {t.median:.0f} through the proxy (x{c.ratio:.2f}; "
            f"direct {d.min:.0f}-{d.max:.0f}, through {t.min:.0f}-{t.max:.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
