"""docs/findings/sentinel.md's table: the built-in designs under `sentinel-kill` (the primary of a private
Sentinel topology SIGKILLed; the sentinels promote a replica on their own), one row per design over the
result's repeats: the promotion time (the broker fault record's back_at - at: from the kill until a
sentinel first named another primary), and what the run lost, refused and ran twice.

    python lab/sentinel_promotion.py results/readme/sentinel

With --split, the second table: the split brain (`sentinel-partition`, and `sentinel-partition-min-replicas`
with min-replicas-to-write 1), one row per scenario and design over the repeats: the promotion time, the
enqueues acknowledged in all and by the old primary after the cut, how many it refused, the acknowledged
enqueues lost (and their share of all the acknowledged ones, Jepsen's measure), the acks lost, and the
minority's workers the old primary still served as the partition healed.

    python lab/sentinel_promotion.py --split results/readme/sentinel-partition
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


def split_table(directory: Path) -> str:
    runs: dict[tuple[str, str], list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        for run in result.runs:
            runs.setdefault((str(result.scenario["name"]), run.design), []).append(run)
    lines = [
        "| scenario | design | runs | promotion, median (min-max) | acknowledged | ... by the old primary after "
        "the cut | refused by it | lost | lost of acknowledged | acks lost (ran again) | workers on old primary |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (scenario, design), rs in sorted(runs.items()):
        times = [promotion_s(r) for r in rs]
        acked = [r.counts.enqueued - r.counts.indeterminate for r in rs]
        share = [round(100 * r.counts.lost / a) for r, a in zip(rs, acked, strict=True)]
        promotion = f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})"
        lines.append(
            f"| `{scenario}` | `{design}` | {len(rs)} | {promotion} | "
            f"{_spread(acked)} | {_spread([r.counts.acked_on_old_primary for r in rs])} | "
            f"{_spread([r.counts.refused_on_old_primary for r in rs])} | {_spread([r.counts.lost for r in rs])} | "
            f"{_spread(share)}% | {_spread([r.counts.acks_lost for r in rs])} | "
            f"{_spread([r.counts.workers_on_old_primary for r in rs])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    split = sys.argv[1:2] == ["--split"]
    args = sys.argv[2:] if split else sys.argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print((split_table if split else table)(Path(args[0])))
