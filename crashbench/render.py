"""Rich rendering of results and progress. CLI-side only: the core never imports this."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from crashbench.results import DesignRun, Result
from crashbench.runner import Progress

# (label, count field) in display order; outcome classes first, then events.
ROWS: tuple[tuple[str, str], ...] = (
    ("enqueued", "enqueued"),
    ("done", "done"),
    ("lost", "lost"),
    ("stranded", "stranded"),
    ("failed", "failed"),
    ("dead-lettered", "dead_lettered"),
    ("  of which poison", "dead_lettered_poison"),
    ("duplicated", "duplicated"),
    ("  overlapping", "duplicated_overlapping"),
    ("  sequential", "duplicated_sequential"),
    ("extra executions", "extra_executions"),
    ("requeued", "requeued"),
    ("failed attempts", "failed_attempts"),
    ("retried", "retried"),
    ("  before their backoff", "early_retries"),
    ("unexpected", "unexpected"),
    ("interrupted", "interrupted"),
)
ALARM = {"lost", "stranded", "failed", "duplicated", "extra_executions", "unexpected", "early_retries"}
# Shown only when some run has a non-zero value: a plain crash test keeps a short table.
OPTIONAL = {
    "failed", "dead_lettered_poison", "duplicated_overlapping", "duplicated_sequential", "failed_attempts", "retried",
    "early_retries",
}  # fmt: skip


def _ms3(values: tuple[float | None, ...]) -> str:
    if all(v is None for v in values):
        return "-"
    return " / ".join("-" if v is None else f"{v:.0f}" for v in values) + " ms"


def _failed_counts(run: DesignRun) -> set[str]:
    return {e.expectation.split(" ")[0] for e in run.expectations if not e.met}


def result_table(result: Result) -> Group:
    sc = result.scenario
    design = f"{result.runs[0].design}: " if result.kind == "sweep" and result.runs else ""
    title = design + (
        f"{sc['name']}: {sc['jobs']} jobs x {sc['job_ms']:g} ms, {sc['workers']} workers, "
        f"{sc['kills']} x {sc['signal']} every {sc['interval']:g} s ({sc['kill_when']}), seed {sc['seed']}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("", style="bold")
    for run in result.runs:
        table.add_column(run.variant or run.design, justify="right")
    failed = [_failed_counts(run) for run in result.runs]
    for label, key in ROWS:
        if key in OPTIONAL and not any(getattr(run.counts, key) for run in result.runs):
            continue
        cells = []
        for run, bad in zip(result.runs, failed, strict=True):
            value = getattr(run.counts, key)
            style = "red" if key in bad else ("yellow" if value and key in ALARM else "")
            cells.append(Text(f"{value}{' ✗' if key in bad else ''}", style=style))
        table.add_row(label, *cells)
    table.add_section()
    table.add_row("kills (mid-job)", *[f"{r.counts.kills} ({r.counts.kills_mid_job})" for r in result.runs])
    table.add_row(
        "wall time (x ideal)", *[f"{r.timings.wall_s:.2f} s ({r.timings.ratio_to_ideal:.2f}x)" for r in result.runs]
    )
    table.add_row("jobs/s", *[f"{r.timings.jobs_per_s:.0f}" for r in result.runs])
    table.add_row("worker start (median)", *[f"{r.timings.startup_ms_median:.1f} ms" for r in result.runs])
    table.add_row(
        "restart (median)",
        *[
            f"{r.timings.restart_ms_median:.1f} ms" if r.timings.restart_ms_median is not None else "-"
            for r in result.runs
        ],
    )
    if any(r.timings.recovery_ms_max is not None for r in result.runs):
        latencies = [
            (r.timings.recovery_ms_p50, r.timings.recovery_ms_p95, r.timings.recovery_ms_max) for r in result.runs
        ]
        table.add_row("recovery p50 / p95 / max", *[_ms3(c) for c in latencies])
    parts: list[Table | Text] = [table]
    for run in result.runs:
        name = f"{run.design} [{run.variant}]" if run.variant else run.design
        if not run.timings.drained:
            parts.append(
                Text(
                    f"{name}: jobs still held {run.timings.window_s:g} s after the last fault (stranded;"
                    " --drain-timeout waits longer)",
                    style="yellow",
                )
            )
        for where, n in run.counts.stranded_at.items():
            parts.append(Text(f"{name}: {n} stranded in {where}", style="yellow"))
        for e in run.expectations:
            mark, style = ("✓", "green") if e.met else ("✗", "red")
            parts.append(Text(f"{mark} {name}: {e.expectation} (got {e.actual})", style=style))
        for w in run.worker_exits:
            parts.append(Text(f"! {name}: worker {w.worker} ended on its own ({w.how})", style="yellow"))
        if run.workdir:
            parts.append(Text(f"{name}: ledgers and worker logs kept in {run.workdir}", style="dim"))
        for p in run.count_problems:
            parts.append(Text(f"! {name}: counts do not add up: {p}", style="bold red"))
    return Group(*parts)


def progress_line(p: Progress) -> Text:
    return Text.assemble(
        (f"{p.design:>10} ", "bold"),
        (f"{p.phase:<9} ", "cyan"),
        f"done {p.done}/{p.enqueued}  kills {p.kills}/{p.kills_total}  workers alive {p.alive}  {p.elapsed:5.1f} s",
    )
