"""The network table (docs/findings/network.md) from the result files `make network` writes: one row per scenario and
design (the newest result of each): lost, duplicated (of which overlapping), stuck workers, how soon
the slowest of the faulted workers (the producer: its enqueues) resumed after the fault healed, how soon the queue
drained, and, where the producer enqueued during the run, its indeterminate enqueues (of which ran).

    python lab/network_table.py results/readme/network
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from crashbench.model.results import DesignRun, Result


def _after(ms: float | None, none: str) -> str:
    return none if ms is None else f"{ms / 1000:.2f} s"


def row(scenario: str, run: DesignRun) -> str:
    c, faults = run.counts, run.network_faults
    # Resumed: the slowest faulted slot's first job after the heal (the producer: its first enqueue).
    resumes = [nf.slowest_resume_ms for nf in faults if nf.healed_at is not None and nf.target != "replica"]
    resume = "never" if any(r is None for r in resumes) else _after(max(resumes, default=None), "-")  # type: ignore[arg-type]
    drained = [nf.drained_ms for nf in faults if nf.healed_at is not None]
    drain = _after(max((d for d in drained if d is not None), default=None), "not drained")
    if not drained:  # no fault healed (it lasted to the end): whether the run drained at all
        drain = "-" if run.timings.drained else "not drained"
    dup = f"{c.duplicated} ({c.duplicated_overlapping})"
    produced = any(nf.target == "producer" for nf in faults) or run.broker_fault is not None
    indeterminate = f"{c.indeterminate} ({c.recovered})" if produced else "-"
    # A run whose evidence checks failed is broken: its figures are shown, marked, never trusted.
    design = run.design + (f" (broken: {', '.join(sorted({p.check for p in run.problems}))})" if run.problems else "")
    return f"| {scenario} | {design} | {c.lost} | {dup} | {c.stuck_workers} | {resume} | {drain} | {indeterminate} |"


def main(directory: str) -> int:
    newest: dict[tuple[str, str], tuple[str, DesignRun]] = {}
    for path in sorted(Path(directory).glob("*.json")):  # ids start with the date: later files win
        result = Result.from_dict(json.loads(path.read_text()))
        for run in result.runs:
            newest[(str(result.scenario["name"]), run.design)] = (str(result.scenario["name"]), run)
    columns = ("scenario", "design", "lost", "duplicated (overlapping)", "stuck workers", "resumed after the heal",
               "drained after the heal", "indeterminate enqueues (ran)")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scenario, run in newest.values():
        print(row(scenario, run))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
