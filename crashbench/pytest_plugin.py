"""crashbench as a pytest plugin (issue 28, item 5), registered through the `pytest11` entry point:
`pip install 'crashbench[pytest]'`.

The `crashbench` fixture runs one crash run on a private embedded server, the same path as
`crashbench run` (crashbench.run.session.run_designs: provisioning, the run, every process stopped on
any ending), saves its result and writes its HTML report, and returns a `CrashResult`:

    def test_reliable_loses_nothing(crashbench):
        result = crashbench.run(design="reliable", jobs=200, kills=2)
        result.assert_valid()           # Jepsen's total-queue verdict, and no evidence problem
        assert result.counts.done == 200

`@pytest.mark.crashbench(design=..., scenario=..., **settings)` sets the fixture's defaults for a
test (a class's or module's marker too; the closest wins). Under pytest-xdist every test process
starts its own servers on free ports. A top layer beside the command line: it imports the core, the
core never imports it; the core is imported only once a test runs something, so that a pytest
session with crashbench installed pays nothing for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from crashbench.model.counts import Counts, TotalQueue
    from crashbench.model.results import DesignRun, Result, ThresholdResult
    from crashbench.model.spec import Scenario

MARKER = "crashbench"
DEFAULT_DESIGN = "reliable"  # as `crashbench run`
SAMPLE = 10  # job ids shown per failure
T = TypeVar("T")


class CrashbenchWarning(UserWarning):
    """What a run warns of before it starts (a library setting that would re-run or cancel healthy jobs)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("crashbench", "crashbench crash runs (the crashbench fixture)")
    help_dir = (
        "Save each crash run's result and HTML report in this results store (crashbench results --dir DIR "
        "lists them) instead of the test's tmp_path."
    )
    group.addoption("--crashbench-dir", metavar="DIR", default=None, help=help_dir)
    parser.addini("crashbench_dir", help_dir + " Relative to the rootdir.", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(design=None, scenario=None, **settings): the crashbench fixture's defaults for this test: "
        "the design, the scenario (a name or a TOML path) and scenario settings by flat names (jobs=200, kills=2)",
    )


@pytest.fixture
def crashbench(request: pytest.FixtureRequest, tmp_path: Path) -> Crashbench:
    """Crash runs for this test: `crashbench.run(design=..., scenario=..., **settings)` -> CrashResult."""
    return Crashbench(marker_defaults(request.node), store_dir(request.config, tmp_path))


def marker_defaults(node: pytest.Item) -> dict[str, Any]:
    """The settings of every crashbench marker on the test, the farthest first so the closest wins; a
    marker's one positional argument is the design."""
    out: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers(MARKER))):
        if len(mark.args) > 1:
            pytest.fail(f"crashbench: @pytest.mark.{MARKER} takes one positional argument, the design", pytrace=False)
        out.update({"design": mark.args[0]} if mark.args else {}, **mark.kwargs)
    return out


def store_dir(config: pytest.Config, tmp_path: Path) -> Path:
    """--crashbench-dir (from the invocation directory), else the ini's crashbench_dir (from the
    rootdir), else the test's own tmp_path."""
    given = config.getoption("crashbench_dir")
    if given:
        return config.invocation_params.dir / given
    ini = config.getini("crashbench_dir")
    return config.rootpath / ini if ini else tmp_path / "crashbench"


def reported(call: Callable[[], T]) -> T:
    """`call()`, crashbench's errors shown as pytest shows a usage error: one line and its hint, no
    traceback; an interrupted run (Ctrl-C, SIGTERM: every process already stopped) as the
    interruption it is."""
    __tracebackhide__ = True
    from crashbench.errors import CrashbenchError, Interrupted

    try:
        return call()
    except Interrupted:
        raise KeyboardInterrupt from None
    except CrashbenchError as exc:
        failure = f"crashbench: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")
    pytest.fail(failure, pytrace=False)  # out of the except block: no "during handling of ..." above it


class Crashbench:
    """The fixture: `defaults` from the test's markers, results and reports saved in `store`."""

    def __init__(self, defaults: dict[str, Any], store: Path) -> None:
        self.defaults = defaults
        self.store = store
        self.results: list[CrashResult] = []  # every run of this test, in order

    def run(
        self, design: str | None = None, scenario: str | Path | Scenario | None = None, **settings: Any
    ) -> CrashResult:
        """One crash run of `design` (a built-in or package.module:Class) on `scenario` (a name, a TOML
        path or a Scenario; the marker's, else default) with `settings` overriding its keys by their flat
        names (jobs=200, kills=2, interval=0.1), on a private embedded server. Returns a CrashResult."""
        __tracebackhide__ = True
        given = {**self.defaults, **settings}
        marked_design, marked_scenario = given.pop("design", None), given.pop("scenario", None)
        design = design or marked_design or DEFAULT_DESIGN
        scenario = scenario if scenario is not None else marked_scenario
        crash = reported(lambda: CrashResult.of(run_one(build(scenario, given), design), self.store))
        self.results.append(crash)
        return crash


def build(scenario: str | Path | Scenario | None, settings: dict[str, Any]) -> Scenario:
    """The scenario with `settings` applied and validated as the command line's are. A name a scenario
    does not have is a usage error that says so (and which name was meant, when one is close)."""
    from crashbench import scenario as scenarios
    from crashbench.errors import UsageError
    from crashbench.model.spec import Scenario

    base = scenario if isinstance(scenario, Scenario) else scenarios.load(None if scenario is None else str(scenario))
    known = set(base.to_dict()) - {"expect", "source"}  # what a scenario file says, not a setting
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise UsageError(
                f"unknown setting {name!r}" + (f": did you mean {close[0]!r}?" if close else ""),
                hint="settings are scenario keys by their flat names (jobs, kills, interval, ...: docs/reference.md); "
                "thresholds go to result.check('lost == 0')",
            )
    return scenarios.with_overrides(base, **settings)


def run_one(scenario: Scenario, design: str) -> Result:
    """`crashbench run`'s session: SIGINT and SIGTERM stop the run and every process it started (the
    flag is read between steps) when this is the main thread, the only one a signal handler can be set in."""
    from crashbench.control.stopflag import StopFlag
    from crashbench.run.session import Options, run_designs

    def warn(text: str) -> None:
        warnings.warn(text, CrashbenchWarning, stacklevel=2)

    main = threading.current_thread() is threading.main_thread()
    stop = StopFlag() if main else None
    with stop.installed() if stop is not None else contextlib.nullcontext():
        return run_designs(scenario, [design], Options(warn=warn, stop=stop))


@dataclasses.dataclass(frozen=True)
class CrashResult:
    """A crash run's result (`result`), saved at `path`, and its HTML report (`report`)."""

    result: Result
    path: Path
    report: Path

    @classmethod
    def of(cls, result: Result, store: Path) -> CrashResult:
        from crashbench.errors import UsageError
        from crashbench.report import html

        try:
            path = result.write(store)
            timelines = [r.timeline for r in result.runs if r.timeline is not None]
            report = html.write(result, timelines, path.with_suffix(".html"))
        except OSError as exc:
            raise UsageError(f"cannot write the result to {store}: {exc.strerror or exc}") from None
        return cls(result, path, report)

    @property
    def runs(self) -> list[DesignRun]:
        return self.result.runs

    @property
    def counts(self) -> Counts:
        """The run's counts (crashbench.model.counts.Counts: lost, done, duplicated, ...)."""
        return self.runs[0].counts

    @property
    def total_queue(self) -> TotalQueue:
        """The counts in Jepsen's total-queue terms, with its verdict (`valid`)."""
        return _total_queue(self.runs[0])

    @property
    def status(self) -> str:
        """pass, fail, inconclusive, broken or unchecked, as `crashbench check` gives it."""
        return self.result.status

    def assert_valid(self) -> None:
        """AssertionError unless every run is a valid total queue (nothing lost, nothing unexpected, no
        duplicate where the design promises exactly once) and no evidence check failed; its message
        gives the counts, some of the job ids and the HTML report's path."""
        __tracebackhide__ = True
        from crashbench.model.results import label

        lines = []
        for run in self.runs:
            tq = _total_queue(run)
            if not tq.valid:
                lines.append(
                    f"{label(run)}: not a valid total queue: lost {tq.lost}, unexpected {tq.unexpected}, "
                    f"duplicated {tq.duplicated} of {tq.attempted} enqueued ({tq.acknowledged} acknowledged, "
                    f"{tq.ok} ok, {tq.recovered} recovered)"
                )
                lines += [f"  {what}: {ids}" for what, ids in self._samples(run, tq.duplicated > 0)]
            lines += self._problems(run)
        if lines:
            raise AssertionError(self._message("crashbench: the run is not valid", lines))

    def check(self, *rules: str) -> list[ThresholdResult]:
        """AssertionError unless every threshold is met: `rules` in crashbench's threshold syntax
        ("lost == 0", "duplicated <= 2", "reliable: recovery_p95 < 2s"), or without any, the
        scenario's own [expect.*] and the defaults they imply, as `crashbench check` evaluates them.
        Returns the thresholds' results."""
        __tracebackhide__ = True
        results = reported(lambda: self._evaluate(rules)) if rules else list(self.result.thresholds)
        lines = [line for run in self.runs for line in self._problems(run)]
        lines += [f"✗ {t.design}: {t.threshold} ({got(t)})" for t in results if not t.met]
        if not results:
            lines.append("no threshold applied: give rules, like check('lost == 0')")
        if lines:
            raise AssertionError(self._message("crashbench: thresholds not met", lines))
        return results

    def _evaluate(self, rules: tuple[str, ...]) -> list[ThresholdResult]:
        from crashbench.errors import UsageError
        from crashbench.model import thresholds
        from crashbench.model.results import group

        try:
            given = [thresholds.parse(rule, source="pytest") for rule in rules]
        except thresholds.ThresholdSyntaxError as exc:
            raise UsageError(f"threshold {exc}") from None
        if any(t.relative for t in given):
            raise UsageError("a relative threshold (…%) needs a baseline, which a test has none of")
        groups = group(self.runs)
        thresholds.check_targets(list(groups), (), {}, given)  # a design not in the run: a usage error
        return [
            thresholds.evaluate(t, name, runs, None)
            for t in given
            for name, runs in groups.items()
            if t.design in (None, runs[0].design, name)
        ]

    @staticmethod
    def _samples(run: DesignRun, duplicated: bool) -> list[tuple[str, str]]:
        out = []
        if lost := run.jobs.get("lost", []):
            out.append(("lost jobs", ", ".join(lost[:SAMPLE]) + (" ..." if len(lost) > SAMPLE else "")))
        if duplicated and run.duplicates:
            twice = [f"{job} x{n}" for job, n in list(run.duplicates.items())[:SAMPLE]]
            out.append(("run more than once", ", ".join(twice) + (" ..." if len(run.duplicates) > SAMPLE else "")))
        return out

    @staticmethod
    def _problems(run: DesignRun) -> list[str]:
        from crashbench.model.results import label

        return [f"{label(run)}: evidence problem {p}" for p in run.problems]

    def _message(self, title: str, lines: list[str]) -> str:
        kept = {r.workdir for r in self.runs if r.workdir}
        where = [f"report: {self.report}", f"result: {self.path}", *(f"ledgers and worker logs: {d}" for d in kept)]
        return "\n".join([title, *(f"  {line}" for line in lines), *where])


def got(t: ThresholdResult) -> str:
    from crashbench.model.results import number

    def shown(v: float | None) -> str:
        return "-" if v is None else f"{number(v)} {t.unit}".rstrip()

    return f"got {shown(t.actual)}, bound {shown(t.expected)}" + (f"; {t.note}" if t.note else "")


def _total_queue(run: DesignRun) -> TotalQueue:
    """The run's total-queue verdict as its checkers gave it (counted again from a run saved without one)."""
    from crashbench.evidence.counts import total_queue

    return run.total_queue if run.total_queue is not None else total_queue(run.counts)
