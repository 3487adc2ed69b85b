"""The stream consumer tables (docs/findings/stream-consumers.md) from the result files `make stream-consumers` writes:

1. recovery: stream (XAUTOCLAIM after stale_after) against stream-reuse (the replacement re-reads its
   slot's consumer name's pending entries) on the default scenario, per seed and the median;
2. name reuse while the holder lives (scenario name-reuse, SIGTERM): jobs run twice, re-reads;
3. consumer churn: the consumers each group still held at the harness's final reading (XINFO
   CONSUMERS) after 5, 10 and 20 SIGKILLs, without the cleanup (tests/designs_consumers.py), with it
   (stream), and with name reuse, the idle times of those left, and the requeues and dead letters
   (a slot killed three times running dead-letters the job its replacements re-read).

    python lab/stream_consumers.py results/readme/stream-consumers
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from crashbench.model.results import DesignRun, Result

RECOVERY_INTERVAL = 0.5  # the default scenario's; the churn runs kill every 0.2 s
SHORT = {"designs_consumers:StreamKeepsConsumers": "stream, no cleanup"}


def median(values: Sequence[float | None], fmt: Callable[[float], str] = lambda v: f"{v:g}") -> str:
    """The median, and (min-max) when they differ."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mid, low, high = statistics.median(present), min(present), max(present)
    return fmt(mid) if low == high else f"{fmt(mid)} ({fmt(low)}-{fmt(high)})"


def ms(v: float) -> str:
    return f"{v:.0f} ms"


Key = tuple[str, int, float, str]  # scenario, kills, interval, design


def load(directory: str) -> dict[Key, list[DesignRun]]:
    """(scenario, kills, interval, design) -> its runs, in the order the files were written."""
    runs: dict[Key, list[DesignRun]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        result = Result.from_dict(json.loads(path.read_text()))
        for run in result.runs:
            sc = result.scenario
            key = (str(sc["name"]), int(sc["kills"]), float(sc["interval"]), run.design)
            runs.setdefault(key, []).append(run)
    return runs


def main(directory: str) -> int:
    runs = load(directory)
    broken = [f"{k[3]} seed {r.seed}" for k, rs in runs.items() for r in rs if r.problems]
    print("Recovery, default scenario (fault -> next start of the killed job); median over seeds (min-max):")
    print("| design | seeds | recovery p50 | recovery p95 | recovery max | restart | requeue events | lost | dup. |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (scenario, _, interval, design), rs in runs.items():
        if scenario != "default" or interval != RECOVERY_INTERVAL:
            continue
        t = [r.timings for r in rs]
        cells = [
            ",".join(str(r.seed) for r in rs),
            median([x.recovery_ms_p50 for x in t], ms),
            median([x.recovery_ms_p95 for x in t], ms),
            median([x.recovery_ms_max for x in t], ms),
            median([x.restart_ms_median for x in t], lambda v: f"{v:.1f} ms"),
            median([r.counts.requeue_events for r in rs]),
            median([r.counts.lost for r in rs]),
            median([r.counts.duplicated for r in rs]),
        ]
        print(f"| {design} | " + " | ".join(cells) + " |")
    print()
    print("Name reuse while the holder lives (scenario name-reuse: 5 x SIGTERM mid-job, 200 ms jobs):")
    print("| design | seeds | duplicated | of which overlapping | requeue events (re-reads) | empty acks | lost |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for (scenario, _, _, design), rs in runs.items():
        if scenario != "name-reuse":
            continue
        c = [r.counts for r in rs]
        cells = [
            ",".join(str(r.seed) for r in rs),
            median([x.duplicated for x in c]),
            median([x.duplicated_overlapping for x in c]),
            median([x.requeue_events for x in c]),
            median([x.empty_acks for x in c]),
            median([x.lost for x in c]),
        ]
        print(f"| {design} | " + " | ".join(cells) + " |")
    print()
    print("Consumers left in the group at the end (harness's XINFO CONSUMERS), by SIGKILLs every 0.2 s:")
    print("| design | kills | seeds | consumers left | of which pending | idle of those left | requeue events | dead |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for (scenario, kills, interval, design), rs in sorted(runs.items(), key=lambda kv: (kv[0][3], kv[0][1])):
        if scenario != "default" or interval == RECOVERY_INTERVAL:
            continue
        left = [c for r in rs for c in r.consumers]
        cells = [
            str(kills),
            ",".join(str(r.seed) for r in rs),
            median([r.counts.consumers for r in rs]),
            median([sum(c.pending for c in r.consumers) for r in rs]),
            median([c.idle_ms / 1000 for c in left], lambda v: f"{v:.1f} s"),
            median([r.counts.requeue_events for r in rs]),
            median([r.counts.dead_lettered for r in rs]),
        ]
        print(f"| {SHORT.get(design, design)} | " + " | ".join(cells) + " |")
    if broken:
        print("evidence problems in: " + ", ".join(broken))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
