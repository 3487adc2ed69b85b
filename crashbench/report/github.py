"""Exports for GitHub Actions: a step's outputs, and github-action-benchmark's trend data.

`outputs` is what `--github-output FILE` appends to `$GITHUB_OUTPUT` (key=value lines), so a later step
reads `steps.<id>.outputs.verdict` or `.lost` without parsing the result file: the verdict, the
thresholds evaluated and violated, and the headline counts summed over every run (designs and repeats).

`benchmark` is the `customSmallerIsBetter` input of github-action-benchmark
(benchmark-action/github-action-benchmark): a JSON list of `{"name", "unit", "value"}` entries, with the
optional `range` and `extra` strings it shows in a chart's tooltip. Per design (or sweep value): lost and
duplicated jobs, the mean over the repeats (a figure that stays comparable when --repeat changes), and
the recovery p95 in ms, the median over the repeats (as a threshold checks a timing). A design none of
whose runs has a finite recovery p95 (nothing recovered, or a killed job never started again) has no
recovery entry: its lost and stranded counts say what happened.

Core code: no click, no rich.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from crashbench.model.results import DesignRun, Result, group

# The counts a CI step most likely branches on, summed over the runs: enough to say "3 jobs lost".
HEADLINE_COUNTS: tuple[str, ...] = (
    "enqueued", "done", "lost", "duplicated", "stranded", "dead_lettered", "failed", "undrained", "unexpected",
    "effect_missing", "effect_duplicated",  # the user's own check's ([app] check): 0 without one
)  # fmt: skip


def outputs(result: Result, saved: Path | None = None) -> dict[str, str]:
    """The step outputs of a result, in a fixed order; `saved`: where its JSON was written (given
    absolute: a later step may run in another directory)."""
    out = {
        "verdict": result.status,
        "result_id": result.id,
        "designs": ",".join(group(result.runs)),
        "runs": str(len(result.runs)),
        "thresholds": str(len(result.thresholds)),
        "violated": str(sum(t.status == "fail" for t in result.thresholds)),
        "inconclusive": str(sum(t.status == "inconclusive" for t in result.thresholds)),
        "evidence_problems": str(len(result.problems)),
    }
    for name in HEADLINE_COUNTS:
        out[name] = str(sum(getattr(r.counts, name) for r in result.runs))
    if saved is not None:
        out["result"] = str(saved.resolve())  # later steps may run in another directory
    return out


def output_lines(values: dict[str, str]) -> str:
    """GitHub's `$GITHUB_OUTPUT` syntax: `key=value`, or a heredoc for a value with a line break."""
    lines = []
    for key, value in values.items():
        if "\n" in value or "\r" in value:
            delimiter = "CRASHBENCH_EOF"
            while delimiter in value:
                delimiter += "_"
            lines += [f"{key}<<{delimiter}", value, delimiter]
        else:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def append_outputs(result: Result, path: Path, saved: Path | None = None) -> Path:
    """Append the outputs to `path` (the runner gives each step its own file; earlier lines stay)."""
    with path.open("a", encoding="utf-8", newline="") as f:
        f.write(output_lines(outputs(result, saved)))
    return path


# --- github-action-benchmark ---------------------------------------------------------------------


# (entry name, unit, what of a run, how the repeats combine, the word for it)
_METRICS: tuple[tuple[str, str, Callable[[DesignRun], float | None], Callable[[list[float]], float], str], ...] = (
    ("lost", "jobs", lambda r: r.counts.lost, statistics.fmean, "mean"),
    ("duplicated", "jobs", lambda r: r.counts.duplicated, statistics.fmean, "mean"),
    ("recovery p95", "ms", lambda r: r.timings.recovery_ms_p95, statistics.median, "median"),
)


def _figure(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3f}".rstrip("0")


def benchmark(result: Result) -> list[dict[str, str | float]]:
    """github-action-benchmark's customSmallerIsBetter entries, per design label in run order."""
    entries: list[dict[str, str | float]] = []
    for name, runs in group(result.runs).items():
        seeds = ("seeds " if len(runs) > 1 else "seed ") + ", ".join(str(r.seed) for r in runs)
        for metric, unit, get, combine, how in _METRICS:
            values = [float(v) for r in runs if (v := get(r)) is not None]
            value = combine(values) if values else math.inf
            if not math.isfinite(value):
                continue
            entry: dict[str, str | float] = {"name": f"{name} {metric}", "unit": unit, "value": round(value, 3)}
            if len(values) > 1:
                entry["range"] = f"{_figure(min(values))} to {_figure(max(values))}"
            runs_text = f"{how} of {len(values)} runs" if len(values) > 1 else "1 run"
            entry["extra"] = f"{runs_text} ({seeds}); result {result.id}"
            entries.append(entry)
    return entries


def benchmark_json(result: Result) -> str:
    return json.dumps(benchmark(result), indent=2, allow_nan=False) + "\n"


def write_benchmark(result: Result, path: Path) -> Path:
    path.write_text(benchmark_json(result), encoding="utf-8")
    return path
