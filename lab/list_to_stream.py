"""The tables of docs/findings/list-to-stream.md from the result files `make list-to-stream` writes:

1. LREM by value (scenario lrem-identical): reliable-ids against reliable-noid, with a prefetch of 2 jobs
   per worker's list and with one job per list (the guide's pattern), per seed and the median;
2. the migration (scenarios migrate and migrate-early-stop): per run, the jobs each structure got, lost,
   stranded and duplicated per structure, the list's drain time after the flip; then every kill by
   when it struck (before the flip, during the dual run, after the list workers stopped) and by the
   kind of worker it hit, with what became of the job it interrupted.

    python lab/list_to_stream.py results/readme/list-to-stream
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from crashbench.designs.migrating import on_stream
from crashbench.model.results import DesignRun, Result
from crashbench.model.timeline import Timeline
from crashbench.report.recount import timelines_of


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
            continue  # the migrations have a table of their own
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


def migrations(directory: str) -> list[tuple[str, DesignRun, Timeline]]:
    """(scenario, run, timeline) of every migrate run, in the order the files were written."""
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        result = Result.from_dict(json.loads(path.read_text()))
        name = str(result.scenario["name"])
        if name.startswith("migrate"):
            out += [(name, run, tl) for run, tl in zip(result.runs, timelines_of(path, result), strict=True)]
    return out


def phase(tl: Timeline, t: float) -> str:
    """When a moment of the run falls: before the flip, during the dual run, after the list workers stopped."""
    flip = next(e.t for e in tl.fault_events if e.family == "migrate" and e.what == "flip")
    stop = next((e.t for e in tl.fault_events if e.family == "migrate" and e.what == "stop"), None)
    return "before" if t < flip else "during" if stop is None or t < stop else "after"


def migration(found: list[tuple[str, DesignRun, Timeline]]) -> None:
    print("Migration (scenarios migrate, migrate-early-stop, migrate-llen), per run; list / stream:")
    print(
        "| scenario | seed | kills before / during / after | enqueued | lost | stranded | duplicated"
        " | list drained after the flip |"
    )
    print("| --- | ---: | --- | --- | --- | --- | --- | ---: |")
    for name, run, tl in found:
        c = run.counts
        when = [phase(tl, k.at) for k in run.kills]
        stop = next(e for e in tl.fault_events if e.family == "migrate" and e.what == "stop")
        how = "stopped early" if stop.data["early"] else "stopped at LLEN 0"
        drain = f"{c.list_drain_ms} ms" if c.list_drained else f"never ({how})"
        cells = [
            " / ".join(str(when.count(p)) for p in ("before", "during", "after")),
            f"{c.enqueued_list} / {c.enqueued_stream}",
            f"{c.lost_list} / {c.lost_stream}",
            f"{c.stranded_list} / {c.stranded_stream}",
            f"{c.duplicated_list} / {c.duplicated_stream}",
            drain,
        ]
        print(f"| {name} | {run.seed} | " + " | ".join(cells) + " |")
    print()
    print("Every kill, by when it struck and the worker it hit (all seeds of each scenario):")
    print(
        "| scenario | when | worker | kills | mid-job | job ran again, completed once | stranded | lost | duplicated |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows: dict[tuple[str, str, str], list[int]] = {}
    for name, run, tl in found:
        completions: dict[str, int] = {}
        for ex in tl.executions:
            completions[ex.job] = completions.get(ex.job, 0) + ex.completed
        held = set(tl.located.held) | set(tl.located.dead)  # the final reading: a job never completed is there or lost
        for k in run.kills:
            row = rows.setdefault((name, phase(tl, k.at), "stream" if on_stream(k.slot) else "list"), [0] * 6)
            row[0] += 1
            row[1] += k.mid_job
            if k.job is not None:
                row[2] += completions.get(k.job, 0) == 1 and k.recovered_after_ms is not None
                row[3] += completions.get(k.job, 0) == 0 and k.job in held
                row[4] += completions.get(k.job, 0) == 0 and k.job not in held
                row[5] += completions.get(k.job, 0) > 1
    order = {"before": 0, "during": 1, "after": 2}
    for (name, when, side), row in sorted(rows.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])):
        print(f"| {name} | {when} | {side} | " + " | ".join(str(v) for v in row) + " |")


def main(directory: str) -> int:
    runs = load(directory)
    broken = [f"{k[2]} seed {r.seed}" for k, rs in runs.items() for r in rs if r.problems]
    lrem(runs)
    print()
    migration(migrations(directory))
    if broken:
        print(f"\nevidence problems in: {', '.join(broken)}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
