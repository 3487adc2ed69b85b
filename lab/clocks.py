"""docs/findings/clocks.md's table: the clock scenarios (a worker's wall clock ahead or behind, the server's
clock jumping ahead), one row per scenario and design over the result files' runs: the clock as crashbench
measured it (a skewed worker's probe at each start; the server's TIME after the jump), the counts, and how
the work spread over the worker slots (the skewed slot's share: a worker behind that takes no job is a
stall of that worker; all behind, of the queue).

    python lab/clocks.py results/readme/clocks
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from crashbench.model import timeline
from crashbench.model.timeline import Timeline
from crashbench.report import store


def measured(tl: Timeline) -> str:
    """The clock fault as measured: "+120.0 s (slot 0)", "server +600.0 s at 1.0 s"."""
    out = []
    for e in (e for e in tl.fault_events if e.family == "clock"):
        if e.what == "skewed":
            m = e.data["measured"]
            out.append(f"slot {e.data['slot']} {sum(m) / len(m):+.1f} s" if m else f"slot {e.data['slot']} unread")
        elif e.what == "moved" and e.data["target"] == "server" and e.data["skew"]:
            got = e.data.get("measured")
            out.append(f"server {got:+.1f} s at {e.t:.1f} s" if got is not None else "server unread")
    return ", ".join(out)


def skewed_share(tl: Timeline) -> str:
    """Executions by the skewed slots' workers, of all (the server's clock: "-")."""
    skewed = {w for e in tl.fault_events if e.what == "skewed" for w in e.data["workers"]}
    if not skewed:
        return "-"
    by = Counter(x.worker for x in tl.executions)
    return f"{sum(n for w, n in by.items() if w in skewed)} of {sum(by.values())}"


def rows(directory: Path) -> list[tuple[str, str, Timeline, object]]:
    out = []
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        timelines = {tl.index: tl for tl in timeline.read(path.with_suffix(".timeline.jsonl.gz"))}
        for n, run in enumerate(result.runs):
            out.append((str(result.scenario["name"]), run.design, timelines[n], run.counts))
    return out


def table(directory: Path) -> str:
    lines = [
        "| scenario | design | clock, measured | done | lost | stranded | duplicated | library disagrees | "
        "skewed slot's executions | wall time |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, design, tl, c in rows(directory):
        lines.append(
            f"| [{scenario}](../../scenarios/{scenario}.toml) | `{design}` | {measured(tl)} | "
            f"{c.done} of {c.enqueued} | {c.lost} | {c.stranded} | {c.duplicated} | {c.library_disagrees} | "  # type: ignore[attr-defined]
            f"{skewed_share(tl)} | {tl.drained_at:.1f} s |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(table(Path(sys.argv[1])))
