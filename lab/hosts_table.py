"""docs/how-to/hosts.md's table from the result files `make hosts` writes: one row per design over every run
of the host-crash scenario: the workers the crash killed, the jobs running on the host as it went (from
their final ledgers), of which ran again and lost; the run's own lost, stranded and redelivered (min to max over the
runs); and, from the saved timelines, the reboot's time from the new init to its workers' last READY (median).

    python lab/hosts_table.py results/readme/hosts
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from crashbench.model.results import DesignRun, Result
from crashbench.model.timeline import read


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"


def _reboots(directory: Path) -> dict[str, list[float]]:
    """Per design: each run's time from the reboot (`boot`) to its workers' last READY (`ready`), in ms."""
    out: dict[str, list[float]] = {}
    for path in sorted(directory.glob("*.timeline.jsonl.gz")):
        for tl in read(path):
            t = {e.what: e.t for e in tl.fault_events if e.family == "hosts"}
            if "boot" in t and "ready" in t:
                out.setdefault(tl.spec, []).append((t["ready"] - t["boot"]) * 1000)
    return out


def table(directory: Path) -> str:
    runs: dict[str, list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        for run in Result.from_dict(json.loads(path.read_text())).runs:
            runs.setdefault(run.design, []).append(run)
    reboots = _reboots(directory)
    lines = [
        "| design | runs | workers killed | jobs running on the host | ran again | lost with the host "
        "| lost (run) | stranded (run) | redelivered (run) | reboot to READY |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for design, rs in runs.items():
        c = [r.counts for r in rs]
        cells = [
            _span([k.host_crash_workers for k in c]), _span([k.host_crash_interrupted for k in c]),
            _span([k.host_crash_rerun for k in c]), _span([k.host_crash_lost for k in c]),
            _span([k.lost for k in c]), _span([k.stranded for k in c]), _span([k.redelivered for k in c]),
            f"{statistics.median(reboots[design]):.0f} ms" if reboots.get(design) else "-",
        ]  # fmt: skip
        lines.append(f"| {design} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(directory: str) -> int:
    print(table(Path(directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
