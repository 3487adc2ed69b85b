"""The libraries under the graceful (SIGTERM) and pause (SIGSTOP) scenarios (docs/findings/library-scenarios.md):
one row per scenario and design from the result files `make library-scenarios` writes, each figure over
the seeds (the value, or min-max where they differ).

    python lab/library_scenarios.py results/readme/library-scenarios
"""

from __future__ import annotations

import sys
from pathlib import Path

from crashbench.model.results import DesignRun
from crashbench.report import store

COUNTS = ("done", "lost", "stranded", "failed", "duplicated", "interrupted", "redelivered")


def _spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def table(directory: Path) -> str:
    rows: dict[tuple[str, str], list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        for run in result.runs:
            rows.setdefault((str(result.scenario["name"]), run.design), []).append(run)
    lines = [
        "| scenario | design | runs | " + " | ".join(COUNTS) + " | kills mid-job |",
        "|---|---|---:|" + "---:|" * (len(COUNTS) + 1),
    ]
    for (name, design), runs in sorted(rows.items()):
        cells = " | ".join(_spread([getattr(r.counts, c) for r in runs]) for c in COUNTS)
        mid = _spread([r.counts.kills_mid_job for r in runs])
        lines.append(f"| {name} | `{design}` | {len(runs)} | {cells} | {mid} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(table(Path(sys.argv[1])))
