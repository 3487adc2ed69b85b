"""The cluster failover table (docs/findings/cluster-faults.md) from the result files `make cluster-faults`
writes: one row per
scenario and design, over its repeats (median, and min-max when they differ): held at the fault,
lost, not replicated (what the primary held and the promoted replica did not, acknowledged, never
run), acknowledged during the lag, the bytes the promoted replica was behind, duplicated, acks lost,
indeterminate enqueues (of which ran), undrained, and the recovery time (fault -> replica promoted).

    python lab/cluster_fault_table.py results/readme/cluster-faults
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from crashbench.model.results import DesignRun, Result


def spread(values: list[float], fmt: Callable[[float], str] = lambda v: f"{v:g}") -> str:
    if not values:
        return "-"
    mid, low, high = statistics.median(values), min(values), max(values)
    return fmt(mid) if low == high else f"{fmt(mid)} ({fmt(low)}-{fmt(high)})"


def row(scenario: str, design: str, runs: list[DesignRun]) -> str:
    counts = [r.counts for r in runs]
    faults = [r.broker_fault for r in runs if r.broker_fault is not None]
    behind = [f.primary_offset - f.promoted_offset for f in faults if None not in (f.primary_offset, f.promoted_offset)]
    recovery = [f.back_at - f.at for f in faults if f.back_at is not None]
    broken = sorted({p.check for r in runs for p in r.problems})
    cells = [
        spread([f.held_at_fault for f in faults]),
        "**" + spread([c.lost for c in counts]) + "**",
        spread([c.not_replicated for c in counts]),
        spread([c.acked_during_lag for c in counts]),
        spread(behind),
        spread([c.duplicated for c in counts]),
        spread([c.acks_lost for c in counts]),
        spread([c.indeterminate for c in counts]),
        spread([c.recovered for c in counts]),
        spread([c.undrained for c in counts]),
        spread([s * 1000 for s in recovery], lambda v: f"{v:.0f} ms"),
    ]
    name = design + (f" (broken: {', '.join(broken)})" if broken else "")
    return f"| {scenario} | {name} | " + " | ".join(cells) + " |"


def main(directory: str) -> int:
    runs: dict[tuple[str, str], list[DesignRun]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        result = Result.from_dict(json.loads(path.read_text()))
        for run in result.runs:
            runs.setdefault((str(result.scenario["name"]), run.design), []).append(run)
    columns = ("scenario", "design", "held at the fault", "lost (acknowledged)", "not replicated",
               "acked during the lag", "bytes behind", "duplicated", "acks lost", "indeterminate", "of which ran",
               "undrained", "recovery (promoted after)")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("| --- | --- |" + " ---: |" * (len(columns) - 2))
    for (scenario, design), group in runs.items():
        print(row(scenario, design, group))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
