"""Commands over the results store: results, show, replay, recount."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from crashbench.cli import common as base
from crashbench.errors import RecountMismatch, UsageError
from crashbench.model.results import Result
from crashbench.model.spec import Scenario
from crashbench.report import html as html_report
from crashbench.report import recount as recounting
from crashbench.report import store
from crashbench.run.session import Options, replay_scenario, run_designs


@base.cli.command()
@base.STORE_DIR
@click.option("--scenario", "-s", "scenario_name", metavar="NAME|FINGERPRINT", help="Only results of this scenario.")
@click.option("--design", "-d", metavar="NAME", help="Only results with this design.")
@click.option(
    "--kind",
    type=click.Choice(["all", "crash", "bench"]),
    default="all",
    show_default=True,
    help="crash: results of run, compare, sweep, check, replay ('latest' is the newest of these); bench: of bench.",
)
@click.option("--limit", "-n", type=click.IntRange(min=1), default=20, show_default=True)
@base.reports_errors
def results(store_dir: Path, scenario_name: str | None, design: str | None, kind: str, limit: int) -> None:
    """List saved results, newest first: crash results and bench results (kind 'bench')."""
    found = store.entries(store_dir, scenario_name, design, kind)
    table = Table()  # its title would wrap at the table's width, and it holds a path: printed below
    # An id is what this list is for: never cut or wrapped, whatever the width (80 when not a terminal);
    # the other columns wrap instead.
    table.add_column("id", no_wrap=True, min_width=max((len(e.id) for e in found[:limit]), default=2))
    table.add_column("kind", no_wrap=True, min_width=7)  # short, and what tells a bench result apart
    for column in ("scenario", "fingerprint", "designs", "repeat", "status", "commit"):
        table.add_column(column)
    for e in found[:limit]:
        commit = (e.commit or "-")[:10] + (" (dirty)" if e.dirty else "")
        style = {"pass": "green", "fail": "red", "broken": "bold red"}.get(e.status, "yellow")
        table.add_row(
            e.id,
            "[magenta]bench[/]" if e.kind == "bench" else e.kind,
            e.scenario,
            e.fingerprint,
            ", ".join(e.designs),
            str(e.repeat),
            f"[{style}]{e.status}[/]",
            commit,
        )
    base.out.print(f"[i]results in {escape(str(store_dir))}/ ({len(found)})[/]", highlight=False, soft_wrap=True)
    base.out.print(table)


@base.cli.command()
@click.argument("ref", metavar="FILE|ID")
@base.STORE_DIR
@base.output_options
@base.reports_errors
def show(ref: str, store_dir: Path, **opts: Any) -> None:
    """Render a saved result (a file, an id or id prefix, or 'latest'); exit code from its status."""
    base.prepare(opts, None)  # consoles and export paths, before reading anything
    result = base.load_result(ref, store_dir, opts)
    env = result.environment
    if not opts["as_json"]:
        base.out.print(
            f"[dim]{result.id} · {result.created} · {env.machine} ({env.cpus} cpus) · crashbench {env.crashbench} · "
            f"{env.server_name} {env.server_version}"
            + (
                f" cluster ({env.server_primaries} primaries, {env.server_replicas} replicas)"
                if env.server_primaries
                else ""
            )
            + f" · commit {(env.commit or '-')[:10]}{' dirty' if env.dirty else ''}[/]",
            highlight=False,
            soft_wrap=True,  # the id leads this line: never cut or wrapped
        )
    base.report(result, opts, saved=None)


@base.cli.command()
@click.argument("ref", metavar="FILE|ID")
@click.option(
    "--run", "index", type=int, default=0, show_default=True, help="Which run of the result (0-based, as in its JSON)."
)
@base.STORE_DIR
@base.where_options
@base.output_options
@base.reports_errors
def replay(ref: str, index: int, store_dir: Path, **opts: Any) -> None:
    """Run one stored run again: the same scenario, design and seed, so the same fault schedule (the
    scenario comes from the result; only where to run it is chosen here)."""
    stored = store.load(ref, store_dir)
    if not 0 <= index < len(stored.runs):
        raise UsageError(f"--run {index}: the result has runs 0..{len(stored.runs) - 1}")
    original = stored.runs[index]

    def start(sc: Scenario, options: Options) -> Result:
        result = run_designs(sc, [original.design], options, kind="replay")
        same = result.runs[0].schedule == original.schedule
        base.err.print(
            f"replay of {stored.id} run {index} ({original.design}, seed {original.seed}): "
            + ("the same fault schedule" if same else "[bold red]a different fault schedule[/]")
        )
        return result

    base.execute(opts, start, scenario=replay_scenario(stored, index))


@base.cli.command()
@click.argument("ref", metavar="FILE|ID")
@base.STORE_DIR
@click.option("--plain", is_flag=True, help="No colours.")
@base.reports_errors
def recount(ref: str, store_dir: Path, plain: bool) -> None:
    """Compute every count of a saved result again from its timeline alone (the file beside it), and
    its verdict (status, every threshold result, the summary) from those counts, and compare: exit 0
    when each run and the verdict are reproduced exactly, 4 when anything differs."""
    base.configure_output({"plain": plain})
    path = store.resolve(ref, store_dir)
    result = store.load(str(path))
    found = recounting.verify(path, result, store_dir)
    for r in found.runs:
        if not r.differences:
            base.out.print(f"run {r.index} {escape(r.design)}: [green]reproduced[/] (every count, timing and id)")
            continue
        differences(f"run {r.index} {escape(r.design)}", r.differences)
    if not found.verdict:
        what = f"status {result.status}, {len(result.thresholds)} threshold result(s), the summary"
        base.out.print(f"verdict: [green]reproduced[/] ({escape(what)})")
    else:
        differences("verdict", found.verdict)
    bad = [r for r in found.runs if r.differences]
    if bad or found.verdict:
        parts = [f"{len(bad)} of {len(found.runs)} run(s)"] if bad else []
        parts += ["the verdict"] if found.verdict else []
        raise RecountMismatch(
            f"{result.id}: {' and '.join(parts)} not reproduced from its timeline",
            hint="the timeline is not the record this result came from: edited, or not saved whole",
        )


def differences(what: str, lines: list[str]) -> None:
    base.out.print(f"{what}: [bold red]{len(lines)} difference(s)[/]")
    for line in lines[:20]:
        base.out.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    if len(lines) > 20:
        base.out.print(f"  ... and {len(lines) - 20} more")


@base.cli.command()
@click.argument("ref", metavar="FILE|ID")
@base.STORE_DIR
@click.option(
    "--out", "out_path", type=click.Path(path_type=Path), metavar="FILE",
    help="Where to write it. [default: beside the result, <result>.html]",
)  # fmt: skip
@base.reports_errors
def report(ref: str, store_dir: Path, out_path: Path | None) -> None:
    """Write the HTML report of a saved result: every run's timeline (a lane per worker slot, every
    execution, the faults, the recoveries, queue depth), its counts and thresholds, in one file."""
    path = store.resolve(ref, store_dir)
    result = store.load(str(path))
    timelines = recounting.timelines_of(path, result)
    target = out_path or path.with_suffix(".html")
    base.export.check_paths([target])
    try:
        html_report.write(result, timelines, target)
    except OSError as exc:
        raise UsageError(f"cannot write the report to {target}: {exc.strerror}") from None
    base.out.print(f"report: {escape(str(target))}", highlight=False, soft_wrap=True)
