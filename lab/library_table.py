"""The library table (docs/findings/libraries.md) from the result files `make libraries` writes: one row
per design (its runs in the newest result that has it: one merged compare of every design, or a run of
one), every figure the median of its seeds with (min-max) where they differ, and jobs/s from the runs
without kills; and the column "on a cluster" from what `make libraries-cluster` keeps
(lab/libraries_cluster.py): a design's counts there, or "unsupported" and the library's error, in full
under the table.

    python lab/library_table.py results/readme/libraries results/readme/libraries-throughput \
        results/readme/libraries-cluster
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from crashbench.model.results import DesignRun, Result, group, spread

ORDER = (
    "rq", "rq:reliable", "celery", "celery:acks-late", "dramatiq", "dramatiq:reliable", "huey",
    "arq", "arq:reliable", "taskiq", "taskiq:stream", "taskiq:reliable", "saq", "saq:reliable",
)  # fmt: skip
COUNTS = ("done", "lost", "duplicated", "failed", "stranded", "library_disagrees")


def _seconds(ms: float) -> str:
    return "never" if math.isinf(ms) else f"{ms / 1000:.1f}"


def _tenths(ms: float | None) -> float | None:
    """To the 0.1 s shown, so that seeds which differ only below it show as one value."""
    return ms if ms is None or math.isinf(ms) else round(ms, -2)


def _recovery(runs: list[DesignRun]) -> str:
    p50 = spread([_tenths(r.timings.recovery_ms_p50) for r in runs], _seconds)
    top = spread([_tenths(r.timings.recovery_ms_max) for r in runs], _seconds)
    if p50 == "-" or p50 == top == "never":
        return p50
    return f"{p50} / {top} s"


def _where(runs: list[DesignRun]) -> str:
    places = sorted({p for r in runs for p in r.counts.stranded_at})
    return f" ({', '.join(places)})" if places else ""


def newest(directory: Path) -> dict[str, list[DesignRun]]:
    """design -> its runs in the newest result file that has it."""
    found: dict[str, list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):  # ids start with the date: later files win
        result = Result.from_dict(json.loads(path.read_text()))
        found |= group(result.runs)
    return found


def unsupported(directory: Path) -> dict[str, str]:
    """design -> the one line its run on a cluster ended with (`<design>: unsupported on a cluster: ...`)."""
    found = {}
    for path in sorted(directory.glob("*.txt")):
        line = path.read_text().strip()
        design, _, why = line.partition(": unsupported on a cluster: ")
        found[design] = why
    return found


def _on_cluster(runs: list[DesignRun] | None, why: str | None) -> str:
    if why is not None:
        # The error's type; its message too when it names no node (a redirection's slot and address
        # say nothing the type does not). The whole line is under the table.
        kind, _, message = why.partition(": ")
        redirected = re.search(r"\d+ [\w.:\[\]-]+:\d+", message)
        return f"unsupported: {kind}" + ("" if redirected or not message else f": {message}")
    if not runs:
        return "-"
    cell = f"{spread([r.counts.lost for r in runs])} lost, {spread([r.counts.duplicated for r in runs])} duplicated"
    if (stranded := spread([r.counts.stranded for r in runs])) != "0":
        cell += f", {stranded} stranded{_where(runs)}"
    if any(r.counts.kills_mid_job != r.counts.kills for r in runs):  # the kills that found no handler
        cell += f" ({spread([r.counts.kills_mid_job for r in runs])} of {runs[0].counts.kills} kills mid-job)"
    return cell


def table(
    results: dict[str, list[DesignRun]], throughput: dict[str, list[DesignRun]],
    cluster: dict[str, list[DesignRun]] | None = None,
    errors: dict[str, str] | None = None,
) -> str:  # fmt: skip
    head = ["design", "concurrency", *[c.replace("_", " ") for c in COUNTS], "recovery p50 / max", "window"]
    head.append("jobs/s without kills")
    if cluster is not None:
        head.append("on a cluster (3 primaries)")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for design in sorted(results, key=lambda d: ORDER.index(d) if d in ORDER else len(ORDER)):
        runs = results[design]
        cells = [f"`{design}`", str(runs[0].configuration.get("concurrency", "-"))]
        for name in COUNTS:
            cell = spread([getattr(r.counts, name) for r in runs])
            cells.append(cell + (_where(runs) if name == "stranded" and cell != "0" else ""))
        cells += [_recovery(runs), f"{runs[0].timings.window_s:g} s"]
        plain = throughput.get(design, [])
        cells.append(spread([round(r.timings.jobs_per_s) for r in plain]))
        if cluster is not None:
            cells.append(_on_cluster(cluster.get(design), (errors or {}).get(design)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "results/readme/libraries")
    throughput = Path(sys.argv[2] if len(sys.argv) > 2 else "results/readme/libraries-throughput")
    on_cluster = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    results = newest(directory)
    if not results:
        sys.exit(f"no result files in {directory}: run `make libraries`")
    cluster = newest(on_cluster) if on_cluster and on_cluster.is_dir() else None
    errors = unsupported(on_cluster) if on_cluster and on_cluster.is_dir() else {}
    print(table(results, newest(throughput) if throughput.is_dir() else {}, cluster, errors))
    seeds = sorted({r.seed for runs in results.values() for r in runs})
    print(f"\n{len(results)} designs, seeds {', '.join(map(str, seeds))}; files in {directory}")
    if cluster is not None:
        print(f"\nOn a cluster ({len(cluster)} ran, {len(errors)} unsupported; files in {on_cluster}), in full:\n")
        for design in sorted(errors, key=lambda d: ORDER.index(d) if d in ORDER else len(ORDER)):
            print(f"- `{design}`: {errors[design]}")


if __name__ == "__main__":
    main()
