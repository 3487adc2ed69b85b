"""docs/findings/sentinel.md's table: the built-in designs under `sentinel-kill` (the primary of a private
Sentinel topology SIGKILLed; the sentinels promote a replica on their own), one row per design over the
result's repeats: the promotion time (the broker fault record's back_at - at: from the kill until a
sentinel first named another primary), and what the run lost, refused and ran twice.

    python lab/sentinel_promotion.py results/readme/sentinel
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from crashbench.model.results import DesignRun
from crashbench.report import store


def promotion_s(run: DesignRun) -> float:
    bf = run.broker_fault
    if bf is None or bf.back_at is None:
        raise ValueError(f"{run.design} (seed {run.seed}): no promotion in its record")
    return bf.back_at - bf.at


def _spread(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def table(directory: Path) -> str:
    runs: dict[str, list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        for run in store.load(str(path)).runs:
            runs.setdefault(run.design, []).append(run)
    lines = [
        "| design | runs | promotion, median (min-max) | lost | held at the kill, never done | enqueues refused "
        "(indeterminate) | acks lost (ran again) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for design, rs in runs.items():
        times = [promotion_s(r) for r in rs]
        lines.append(
            f"| `{design}` | {len(rs)} | {statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f}) | "
            f"{_spread([r.counts.lost for r in rs])} | {_spread([r.counts.held_at_fault for r in rs])} | "
            f"{_spread([r.counts.indeterminate for r in rs])} | {_spread([r.counts.acks_lost for r in rs])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(table(Path(sys.argv[1])))
