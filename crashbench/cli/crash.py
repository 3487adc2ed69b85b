"""The crash commands: run, compare, sweep, check, and list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from crashbench import scenario as scenarios
from crashbench.cli import common
from crashbench.cli.common import (
    SHARD,
    STORE_DIR,
    cli,
    execute,
    prepare,
    report,
    reports_errors,
    session_options,
)  # fmt: skip
from crashbench.designs import BUILTIN, load_design
from crashbench.errors import CrashbenchError, UsageError
from crashbench.model.spec import Scenario
from crashbench.report import store
from crashbench.run.session import BUILTIN_ORDER, evaluate, run_designs, run_sweep
from crashbench.scenario import SWEEPABLE

DESIGN_HELP = f"Design to test: {', '.join(BUILTIN)}, or package.module:Class."


@cli.command()
@click.option("--design", "-d", default="reliable", show_default=True, metavar="NAME|module:Class", help=DESIGN_HELP)
@session_options
@reports_errors
def run(design: str, **opts: Any) -> None:
    """Run one design through the scenario's fault schedule and print its counts."""
    execute(opts, lambda sc, options: run_designs(sc, [design], options))


@cli.command()
@click.option(
    "--designs",
    metavar="A,B,...",
    help="Designs to compare. [default: the scenario's run.designs, else every built-in]",
)
@SHARD
@session_options
@reports_errors
def compare(designs: str | None, **opts: Any) -> None:
    """Run several designs on the same scenario and the same fault schedule, side by side."""
    execute(opts, lambda sc, options: run_designs(sc, design_list(designs, sc), options, kind="compare"))


def design_list(designs: str | None, sc: Scenario) -> list[str]:
    names = [d.strip() for d in designs.split(",") if d.strip()] if designs else []
    if designs is not None and not names:
        raise UsageError("--designs is empty")
    return names or list(sc.run.designs) or list(BUILTIN_ORDER)


@cli.command()
@click.option("--design", "-d", default="reliable", show_default=True, metavar="NAME|module:Class", help=DESIGN_HELP)
@click.option(
    "--param",
    "-p",
    required=True,
    metavar="NAME=V1,V2,...",
    help=f"The setting to vary and its values. Sweepable: {', '.join(SWEEPABLE)}.",
)
@SHARD
@session_options
@reports_errors
def sweep(design: str, param: str, **opts: Any) -> None:
    """Run one design once per value of one setting, side by side: counts and recovery latency for
    -p stale_after=0.5,1,2,4, to pick a threshold from data rather than a guess."""
    name, sep, values = param.partition("=")
    if not sep:
        raise UsageError(f"--param {param!r}: write NAME=V1,V2,... such as stale_after=0.5,1,2")
    execute(opts, lambda sc, options: run_sweep(sc, design, name.strip(), values, options))


BASELINE_HELP = (
    "A saved result (file, id, id prefix or 'latest' in --dir) that relative thresholds compare with, "
    "e.g. -t 'jobs_per_s>=-10%'."
)


@cli.command()
@click.option(
    "--designs", metavar="A,B,...", help="Designs to run. [default: the scenario's run.designs, else every built-in]"
)
@click.option("--baseline", metavar="FILE|ID", help=BASELINE_HELP)
@click.option(
    "--results",
    "results_ref",
    metavar="FILE|ID",
    help="Check a saved result instead of running (the run options are then ignored).",
)
@click.option(
    "--strict-baseline",
    is_flag=True,
    help="Refuse a baseline from another scenario (another fingerprint): exit 2. By default, a warning.",
)
@click.option(
    "--allow-unchecked",
    is_flag=True,
    help="Pass a design no threshold applied to (by default that is no verdict: exit 4).",
)
@STORE_DIR
@SHARD
@session_options
@reports_errors
def check(
    designs: str | None,
    baseline: str | None,
    results_ref: str | None,
    store_dir: Path,
    strict_baseline: bool,
    **opts: Any,
) -> None:
    """Run the designs (or read a saved result) and evaluate every threshold: the scenario's [expect.*],
    --threshold, and undrained == 0, worker_crashes == 0 for every design that has one of those. One line
    per threshold; exit 0 all met, 1 one violated, 2 bad usage, 3 server unavailable, 4 no verdict
    (inconclusive, evidence problems, or a design without thresholds)."""
    base = store.load(baseline, store_dir) if baseline else None
    if results_ref is None:
        sc = common.build_scenario(opts)
        if base is not None:
            common.same_experiment(base, baseline or "", sc.fingerprint(), strict_baseline)
        run = lambda sc, options: run_designs(sc, design_list(designs, sc), options, kind="check")  # noqa: E731
        execute(opts, run, base, scenario=sc, gate=True)
        return
    given = prepare(opts, base)
    saved = common.load_result(results_ref, store_dir, opts)
    if base is not None:
        common.same_experiment(base, baseline or "", saved.fingerprint, strict_baseline)
    report(evaluate(saved, given, base), opts, saved=None, gate=True)


@cli.command("list")
@reports_errors
def list_() -> None:
    """Show the built-in designs and the scenarios crashbench can find."""
    designs = Table(title="designs", title_justify="left")
    designs.add_column("name", style="bold")
    designs.add_column("what it is")
    for name in BUILTIN:
        try:
            designs.add_row(name, Text(load_design(name).summary))
        except CrashbenchError as exc:  # data, never markup: "pip install 'crashbench[rq]'" stays whole
            designs.add_row(name, Text(f"not installed: {exc.hint or exc.message}", style="dim"))
    designs.add_row("module:Class", "your own design: a subclass of crashbench.designs.Design")
    common.out.print(designs)
    table = Table(title="scenarios", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("file", style="dim")
    for path in scenarios.available():
        try:
            desc = Text(scenarios.load(str(path)).description)  # a scenario's words are data, never markup
        except CrashbenchError as exc:
            desc = Text(f"invalid: {exc.message}", style="red")
        table.add_row(Text(path.stem), desc, Text(str(path)))
    common.out.print(table)
