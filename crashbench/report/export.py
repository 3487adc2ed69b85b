"""Exports of a result for CI: JUnit XML, a GitHub-flavoured Markdown summary, and CSV.

JUnit follows the Jenkins/Ant schema most CI systems read: one testsuite per design label (a design,
or a sweep value; its repeats together) and one testcase per threshold, so a CI page lists which
design broke which threshold; an evidence problem is an error testcase of its own, and a design no
threshold applied to a failing one (skipped when unchecked designs are allowed). Markdown is the
summary a pull request or `$GITHUB_STEP_SUMMARY` shows; CSV has one row per run, for spreadsheets
and notebooks.

Core code: no click, no rich. `check_paths` lets the CLI reject a bad export path before a long run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from crashbench.errors import UsageError
from crashbench.model.counts import Counts, Problem
from crashbench.model.results import DesignRun, Result, ThresholdResult, Timings, group, number, spread
from crashbench.model.thresholds import coverage
from crashbench.report import github
from crashbench.report import html as html_report
from crashbench.report.svg import depth_chart

# The counts a failure message shows for each run: the outcome classes and the anomalies a reader
# checks first. The full set is in the result file and the CSV.
KEY_COUNTS: tuple[str, ...] = ("enqueued", "done", "lost", "stranded", "failed", "dead_lettered", "duplicated")

MARKS = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️", "broken": "🛑", "unchecked": "⚪"}

UNCHECKED = "no threshold applied"
IDS_SHOWN = 10  # per problem in the Markdown summary; the JUnit text lists them all


def check_paths(paths: Sequence[Path | None]) -> None:
    """Raise UsageError for the first path that cannot be written as a file: a directory, a missing
    parent directory, or no write permission. Nothing existing is truncated or left behind."""
    for path in paths:
        if path is None:
            continue
        if path.is_dir():
            raise UsageError(f"export path {path} is a directory", hint="give a file name, e.g. results/junit.xml")
        parent = path.parent
        if not parent.is_dir():
            raise UsageError(f"export path {path}: directory {parent} does not exist", hint=f"mkdir -p {parent}")
        try:
            # "x" first, so we know for certain whether the file is ours to remove again; an existing
            # file is opened for append, which checks permission without touching its content.
            try:
                with path.open("x"):
                    pass
                created = True
            except FileExistsError:
                with path.open("a"):
                    pass
                created = False
        except OSError as exc:
            raise UsageError(
                f"export path {path} is not writable: {exc.strerror or exc}", hint="choose a path you can write to"
            ) from None
        if created:
            path.unlink(missing_ok=True)


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    # "x" is a ratio: "1.50x" reads better than "1.50 x"
    return f"{number(v)}{unit}" if unit == "x" else f"{number(v)} {unit}".rstrip()


def _got_expected(t: ThresholdResult) -> str:
    text = f"got {_value(t.actual, t.unit)}, expected {_value(t.expected, t.unit)}"
    if t.baseline is not None:
        text += f" (baseline {_value(t.baseline, t.unit)})"
    return text


def _seconds(runs: Sequence[DesignRun]) -> float:
    return sum(r.timings.wall_s for r in runs)


def _scenario_line(result: Result) -> str:
    sc = result.scenario

    def g(key: str) -> str:
        v = sc.get(key, "?")
        return f"{v:g}" if isinstance(v, float) else str(v)

    repeats = f", {result.repeat} repeats" if result.repeat > 1 else ""
    kills = "no worker kills" if sc.get("kills") == 0 else f"{g('kills')} × {g('signal')} every {g('interval')} s"
    return (
        f"{g('name')}: {g('jobs')} jobs × {g('job_ms')} ms, {g('workers')} workers, {kills}, seed {g('seed')}{repeats}"
    )


# --- JUnit ---------------------------------------------------------------------------------------


def _run_counts(runs: Sequence[DesignRun]) -> str:
    """Key counts, one line per run when there are repeats (a gate over repeats fails on one of them)."""
    lines = []
    for run in runs:
        counts = ", ".join(f"{name} {getattr(run.counts, name)}" for name in KEY_COUNTS)
        prefix = f"repeat {run.repeat} (seed {run.seed}): " if len(runs) > 1 else ""
        lines.append(prefix + counts)
    return "\n".join(lines)


def _threshold_text(t: ThresholdResult, runs: Sequence[DesignRun]) -> str:
    lines = [f"{t.design}: {t.threshold} ({t.source})", _got_expected(t)]
    if t.note:
        lines.append(t.note)
    if len(t.values) > 1:
        lines.append("per run: " + ", ".join(_value(v, t.unit) for v in t.values))
    lines.append(_run_counts(runs))
    return "\n".join(lines)


def _testcase(suite: ET.Element, name: str, classname: str, seconds: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")


def _problem_text(run: DesignRun, p: Problem) -> str:
    lines = [f"[{p.check}] {p.message}", f"repeat {run.repeat} (seed {run.seed})"]
    if p.ids:
        lines.append(f"ids ({len(p.ids)}): {', '.join(p.ids)}")
    return "\n".join(lines)


def junit(result: Result, allow_unchecked: bool = False) -> str:
    """JUnit XML (Jenkins/Ant schema): a testsuite per design label, a testcase per threshold.

    A failed threshold is a <failure>; one that could not be evaluated is an <error>, since CI should
    not show it green. A failed evidence check means the counts cannot be trusted (crashbench or the
    design's report is wrong): an <error> testcase of type "evidence" per problem. A design no threshold
    applied to gets a <failure> "no threshold applied", or <skipped> with `allow_unchecked`."""
    env = result.environment
    # The schema's timestamp has no time zone; `created` carries one ("...T12:00:00+0100").
    timestamp = result.created[:19]
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    verdicts = coverage(result)
    root = ET.Element("testsuites", name=f"crashbench {result.scenario.get('name', '')}".rstrip())
    for name, runs in group(result.runs).items():
        seconds = _seconds(runs)
        classname = f"crashbench.{name}"
        suite = ET.SubElement(root, "testsuite", name=name)
        props = ET.SubElement(suite, "properties")
        mine = [t for t in result.thresholds if t.design == name]
        for key, value in (
            ("scenario", str(result.scenario.get("name", ""))),
            ("fingerprint", result.fingerprint),
            ("seeds", ",".join(str(r.seed) for r in runs)),
            ("result_id", result.id),
            ("crashbench_version", env.crashbench),
            ("server", env.server_name),
            ("server_version", env.server_version),
            ("thresholds_evaluated", str(len(mine))),
        ):
            ET.SubElement(props, "property", name=key, value=value)
        tests = failures = errors = skipped = 0
        for t in mine:
            case = _testcase(suite, t.threshold, classname, seconds)
            tests += 1
            text = _threshold_text(t, runs)
            if t.status == "fail":
                failures += 1
                msg = f"{t.threshold}: {_got_expected(t)}"
                ET.SubElement(case, "failure", message=msg, type="threshold").text = text
            elif t.status == "inconclusive":
                errors += 1
                msg = f"{t.threshold}: inconclusive" + (f": {t.note}" if t.note else "")
                ET.SubElement(case, "error", message=msg, type="inconclusive").text = text
        if not mine:
            case = _testcase(suite, UNCHECKED, classname, seconds)
            tests += 1
            msg = f"{name}: {verdicts[name]}"
            if allow_unchecked:
                skipped += 1
                ET.SubElement(case, "skipped", message=msg)
            else:
                failures += 1
                ET.SubElement(case, "failure", message=msg, type="unchecked").text = _run_counts(runs)
        for run in runs:
            for p in run.problems:
                case = _testcase(suite, f"evidence: {p.check}", classname, seconds)
                tests += 1
                errors += 1
                msg = f"{p.message} (crashbench or the design's report is wrong)"
                ET.SubElement(case, "error", message=msg, type="evidence").text = _problem_text(run, p)
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
        suite.set("time", f"{seconds:.3f}")
        suite.set("timestamp", timestamp)
        suite.set("hostname", env.machine)
        total["tests"] += tests
        total["failures"] += failures
        total["errors"] += errors
        total["skipped"] += skipped
    for key, n in total.items():
        root.set(key, str(n))
    root.set("time", f"{_seconds(result.runs):.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="UTF-8", xml_declaration=True).decode("utf-8") + "\n"


# --- Markdown ------------------------------------------------------------------------------------

_ROWS: tuple[tuple[str, Callable[[DesignRun], float | None], Callable[[float], str]], ...] = (
    ("enqueued", lambda r: r.counts.enqueued, number),
    ("done", lambda r: r.counts.done, number),
    ("lost", lambda r: r.counts.lost, number),
    ("stranded", lambda r: r.counts.stranded, number),
    ("failed", lambda r: r.counts.failed, number),
    ("dead-lettered", lambda r: r.counts.dead_lettered, number),
    ("duplicated", lambda r: r.counts.duplicated, number),
    ("redelivered", lambda r: r.counts.redelivered, number),
    ("jobs/s", lambda r: r.timings.jobs_per_s, lambda v: f"{v:.0f}"),
    ("recovery p95 (ms)", lambda r: r.timings.recovery_ms_p95, lambda v: f"{v:.0f}"),
)


def _cell(text: str) -> str:
    # A bare "|" would end the cell; newlines would end the row.
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(result: Result, html: str | None = None, chart: str | None = None) -> str:
    """A GitHub-flavoured Markdown summary: status, scenario, a table of the key figures, the thresholds.
    `html`: the HTML report's path relative to the summary, linked; `chart`: a queue-depth SVG beside it."""
    status = result.status
    lines = [f"## {MARKS[status]} crashbench {result.kind}: {status}", "", _scenario_line(result), ""]
    if html:
        lines += [f"Timeline of every run (lanes, faults, recoveries, queue depth): [{Path(html).name}]({html})", ""]
    if chart:
        lines += [f"![queue depth over time: pending and in flight, per design]({chart})", ""]
    groups = group(result.runs)
    if groups:
        lines.append("| | " + " | ".join(_cell(name) for name in groups) + " |")
        lines.append("|---|" + "---:|" * len(groups))
        for row, get, fmt in _ROWS:
            cells = [spread([get(r) for r in runs], fmt, dash="–") for runs in groups.values()]
            lines.append(f"| {row} | " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
        if result.repeat > 1:
            lines += [f"Repeats: median (min–max) of {result.repeat} runs.", ""]
    if groups:
        # How much each design was checked first: "all met" over 1 threshold is not over 12.
        lines += ["**Thresholds**", "", *(f"- `{name}`: {text}" for name, text in coverage(result).items()), ""]
    if result.thresholds:
        for t in result.thresholds:
            note = f"; {t.note}" if t.note else ""
            note += "; default" if t.source == "default" else ""
            lines.append(f"- {MARKS[t.status]} `{t.design}` {t.threshold}: {_got_expected(t)}{note}")
        lines.append("")
    if result.problems:
        lines += ["**Evidence problems** (crashbench or the design's report is wrong)", ""]
        for r in result.runs:
            for p in r.problems:
                ids = ", ".join(f"`{i}`" for i in p.ids[:IDS_SHOWN]) + (", …" if len(p.ids) > IDS_SHOWN else "")
                shown = f" (ids: {ids})" if ids else ""
                lines.append(f"- 🛑 `{r.variant or r.design}` (seed {r.seed}) `{p.check}`: {p.message}{shown}")
        lines.append("")
    notes = [
        f"- ⚠️ `{r.variant or r.design}` (seed {r.seed}): jobs still held {r.timings.window_s:g} s after the last fault"
        for r in result.runs
        if not r.timings.drained
    ]
    if notes:
        lines += ["**Notes**", "", *notes, ""]
    lines.append(f"<sub>result `{result.id}` · fingerprint `{result.fingerprint}`</sub>")
    return "\n".join(lines) + "\n"


# --- CSV -----------------------------------------------------------------------------------------

_COUNT_FIELDS = tuple(f.name for f in dataclasses.fields(Counts) if f.name != "stranded_at")
_TIMING_FIELDS = tuple(f.name for f in dataclasses.fields(Timings))
CSV_COLUMNS: tuple[str, ...] = ("result_id", "design", "variant", "repeat", "seed", *_COUNT_FIELDS, *_TIMING_FIELDS)


def csv_text(result: Result) -> str:
    """One row per run (repeats included), header first; a missing timing is an empty cell."""
    out = io.StringIO()
    # "\n", not csv's "\r\n": the text is written as is, and a str with "\r\n" would be doubled on Windows
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for run in result.runs:
        writer.writerow(
            [
                result.id,
                run.design,
                run.variant,
                run.repeat,
                run.seed,
                *(getattr(run.counts, name) for name in _COUNT_FIELDS),
                *(getattr(run.timings, name) for name in _TIMING_FIELDS),
            ]
        )
    return out.getvalue()


# --- Writing -------------------------------------------------------------------------------------


def write_exports(
    result: Result,
    junit_path: Path | None,
    markdown_path: Path | None,
    csv_path: Path | None,
    environ: Mapping[str, str] = os.environ,
    allow_unchecked: bool = False,
    html_path: Path | None = None,
    benchmark_path: Path | None = None,
    github_output: Path | None = None,
    saved: Path | None = None,
) -> list[Path]:
    """Write each export given; append the Markdown to `$GITHUB_STEP_SUMMARY` when set (GitHub Actions
    shows that file on the job's page). Returns the paths written, the summary file included.
    `allow_unchecked`: a design without thresholds is skipped in JUnit, not failed. The HTML report
    and the Markdown's chart need every run's timeline (`DesignRun.timeline`). `benchmark_path`:
    github-action-benchmark's JSON; `github_output`: the step outputs appended there, `saved` (the
    result file) among them (crashbench.report.github)."""
    written: list[Path] = []
    timelines = [r.timeline for r in result.runs if r.timeline is not None]
    if len(timelines) != len(result.runs):
        timelines = []
    if html_path is not None:
        if not timelines:
            raise UsageError("no timeline to draw: the result was saved without one")
        written.append(html_report.write(result, timelines, html_path))
    link = chart = None
    if markdown_path is not None:
        if html_path is not None:
            link = os.path.relpath(html_path, markdown_path.parent)
        if timelines:
            svg = markdown_path.with_name(markdown_path.stem + ".depth.svg")
            svg.write_text(depth_chart(timelines), encoding="utf-8")
            written.append(svg)
            chart = svg.name
    md: str | None = None
    renders: tuple[tuple[Path | None, Callable[[Result], str]], ...] = (
        (junit_path, lambda r: junit(r, allow_unchecked)),
        (markdown_path, lambda r: markdown(r, link, chart)),
        (csv_path, csv_text),
    )
    for path, render in renders:
        if path is None:
            continue
        text = render(result)
        if path is markdown_path:
            md = text
        with path.open("w", encoding="utf-8", newline="") as f:
            f.write(text)
        written.append(path)
    if benchmark_path is not None:
        written.append(github.write_benchmark(result, benchmark_path))
    if github_output is not None:
        written.append(github.append_outputs(result, github_output, saved))
    summary = environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        path = Path(summary)
        # Append: earlier steps of the job may have written their own summaries to the same file.
        with path.open("a", encoding="utf-8", newline="") as f:
            f.write((md if md is not None else markdown(result)) + "\n")
        written.append(path)
    return written
