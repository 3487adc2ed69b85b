"""What the network fault proxy costs with no toxic on: `crashbench bench --proxy`'s figure alone (the
reliable design's jobs/s, 4 workers connected directly and through the proxy, 0 ms and 10 ms jobs, the
median of REPEATS measurements each; crashbench.bench.proxy), on a private server.

    python lab/proxy_cost.py               the figures, printed
    python lab/proxy_cost.py --table DIR   the table of docs/findings/benchmarks.md from DIR's bench
                                           results (`crashbench bench --proxy --out DIR/NAME.json`:
                                           make proxy-cost), a row per file and job length
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from crashbench.bench import BenchSettings, run_bench

REPEATS = 3
JOBS = 10_000  # of 0 ms jobs per measurement; a tenth as many of 10 ms ones
# What each result file of make proxy-cost measured (crashbench/control/proxy.py's two paths), by name.
LABELS = {
    "before": "the process, on asyncio (before 2026-12-07)",
    "process": "the process, on its epoll loop (CRASHBENCH_PROXY_SOCKMAP=0)",
    "kernel": "the kernel: a BPF sockmap (as root)",
    "kernel-again": "the kernel again, 10 minutes later",
}


def table(directory: Path) -> str:
    rows = [
        "| proxy path | job | jobs | direct, jobs/s | through the proxy, jobs/s | through / direct |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(directory.glob("*.json"), key=lambda p: list(LABELS).index(p.stem) if p.stem in LABELS else 9):
        for c in json.loads(path.read_text())["proxy"]:
            d, t = c["direct"], c["through"]
            rows.append(
                f"| {LABELS.get(path.stem, path.stem)} | {c['job_ms']:g} ms | {c['jobs']:,} "
                f"| {d['median']:,.0f} ({d['min']:,.0f}–{d['max']:,.0f}) "
                f"| {t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f}) | **×{c['ratio']:.2f}** |"
            )
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--table"] and len(argv) == 2:
        print(table(Path(argv[1])))
        return 0
    if argv:
        print("usage: python lab/proxy_cost.py [--table DIR]", file=sys.stderr)
        return 2
    settings = BenchSettings(designs=(), jobs=JOBS, repeat=REPEATS, memory_jobs=0, proxy=True)
    for c in run_bench(settings).proxy:
        d, t = c.direct, c.through
        print(
            f"{c.job_ms:g} ms jobs: {d.median:.0f} jobs/s direct, {t.median:.0f} through the proxy (x{c.ratio:.2f}; "
            f"direct {d.min:.0f}-{d.max:.0f}, through {t.min:.0f}-{t.max:.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
