"""docs/findings/power.md's table: designs and libraries under a power cut (the `power-loss` scenarios: the
server on crashbench's lazy file system, SIGKILLed and every file cut back to what was fsynced), one row
per persistence mode and design over the result's repeats: the enqueues acknowledged before the cut, the
acknowledged ones lost (and of them, those no durable AOF command names: the cut's by-id evidence), the
jobs the disk gave back and that ran again, the documented loss window, and the measured ones (from the
AOF's last fsync to the cut; from the oldest enqueue the cut took to the cut).

    python lab/power_table.py results/readme/power
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from crashbench.model.results import DesignRun
from crashbench.report import store

# What the persistence mode's documentation promises a power cut may take (redis.io, "Redis persistence").
DOCUMENTED = {
    "aof-always": "none acknowledged",
    "aof-everysec": "1 s (the code allows 2 s)",
    "aof-no": "the kernel's writeback (about 30 s)",
    "rdb": "since the last snapshot (1 s here)",
    "none": "everything",
}


def _span(values: list[float | int | None], unit: str = "") -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "–"
    lo, hi = min(known), max(known)
    fmt = (lambda v: f"{v:.0f}") if unit == "ms" else (lambda v: f"{v:g}")
    text = fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"
    return f"{text} {unit}".rstrip()


def rows(directory: Path) -> list[tuple[str, str, list[DesignRun]]]:
    """(mode label, design, runs) in the order the result files name them."""
    out: dict[tuple[str, str], list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        mode = str(result.scenario["persistence"])  # the scenario's settings, flat
        if result.scenario.get("wait_aof"):
            mode += " + WAITAOF"
        for run in result.runs:
            out.setdefault((mode, run.design), []).append(run)
    order = ["aof-always", "aof-everysec + WAITAOF", "aof-everysec", "aof-no", "rdb", "none"]
    return [(m, d, rs) for (m, d), rs in sorted(out.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1]))]


def table(directory: Path) -> str:
    head = (
        "| persistence | design | acknowledged before the cut | lost | of them, not in the durable AOF "
        "| given back by the disk (ran again) | documented window | since the last fsync | oldest enqueue lost |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for mode, design, runs in rows(directory):
        bfs = [r.broker_fault for r in runs]
        acked = [bf.acknowledged_before if bf is not None else None for bf in bfs]
        aof = mode.startswith("aof")
        lines.append(
            f"| {mode} | {design} | {_span(acked)} | {_span([r.counts.lost for r in runs])} "
            f"| {_span([r.counts.enqueues_cut for r in runs]) if aof else '–'} "
            f"| {_span([r.counts.acks_cut for r in runs])} ({_span([r.counts.acks_cut_reran for r in runs])}) "
            f"| {DOCUMENTED[mode.split(' ')[0]]} "
            f"| {_span([bf.unsynced_ms if bf else None for bf in bfs], 'ms')} "
            f"| {_span([bf.lost_window_ms if bf else None for bf in bfs], 'ms')} |"
        )
    return "\n".join(lines)


def medians(directory: Path) -> dict[str, float]:
    """The median measured window per mode, over every run (for the text)."""
    by: dict[str, list[float]] = {}
    for mode, _, runs in rows(directory):
        by.setdefault(mode, []).extend(
            r.broker_fault.lost_window_ms for r in runs if r.broker_fault and r.broker_fault.lost_window_ms is not None
        )
    return {m: statistics.median(v) for m, v in by.items() if v}


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    print(table(Path(argv[0])))
    for mode, ms in medians(Path(argv[0])).items():
        print(f"median oldest lost enqueue, {mode}: {ms:.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
