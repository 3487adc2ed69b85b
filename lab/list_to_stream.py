"""The tables of docs/findings/list-to-stream.md from the result files `make list-to-stream` writes:

1. LREM by value (scenario lrem-identical): reliable-ids against reliable-noid, with a prefetch of 2 jobs
   per worker's list and with one job per list (the guide's pattern), per seed and the median.

    python lab/list_to_stream.py results/readme/list-to-stream
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from crashbench.model.results import DesignRun, Result


def median(values: Sequence[float]) -> str:
    """The median, and (min-max) when they differ."""
    if not values:
        return "-"
    mid, low, high = statistics.median(values), min(values), max(values)
    return f"{mid:g}" if low == high else f"{mid:g} ({low:g}-{high:g})"


def load(directory: str) -> dict[tuple[str, int, str], list[DesignRun]]:
    """(scenario, batch_size, design) -> its runs, in the order the files were written."""
    runs: dict[tuple[str, int, str], list[DesignRun]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        result = Result.from_dict(json.loads(path.read_text()))
        for run in result.runs:
            key = (str(result.scenario["name"]), int(result.scenario["batch_size"]), run.design)
            runs.setdefault(key, []).append(run)
    return runs


def lrem(runs: dict[tuple[str, int, str], list[DesignRun]]) -> None:
    print("LREM by value (scenario lrem-identical: 800 jobs of 10 ms, two payload values, 4 x SIGKILL mid-job):")
    print("| jobs per list | design | seeds | done | lost | duplicated | extra executions | redeliveries | stranded |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (scenario, batch, design), rs in sorted(runs.items(), key=lambda kv: (-kv[0][1], kv[0][2])):
        if scenario != "lrem-identical":
            continue
        c = [r.counts for r in rs]
        cells = [
            ",".join(str(r.seed) for r in rs),
            median([x.done for x in c]),
            median([x.lost for x in c]),
            median([x.duplicated for x in c]),
            median([x.extra_executions for x in c]),
            median([x.redeliveries for x in c]),
            median([x.stranded for x in c]),
        ]
        print(f"| {batch} | {design} | " + " | ".join(cells) + " |")


def main(directory: str) -> int:
    runs = load(directory)
    broken = [f"{k[2]} seed {r.seed}" for k, rs in runs.items() for r in rs if r.problems]
    lrem(runs)
    if broken:
        print(f"\nevidence problems in: {', '.join(broken)}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
