"""`crashbench recount`: every count of a saved result computed again from its timeline alone, and
compared with what the result says. The result was computed from the same timeline when it was
measured (crashbench.evidence.tally), so any difference means the saved timeline is not the record the counts
came from: a field lost or changed on its way to disk, or a file edited since. The verdict (status,
threshold results, summary) is computed again from the recounted runs and compared too
(crashbench.report.verdict), and so is the scenario the result carries against the one each run's
timeline recorded: the verdict is evaluated from its [expect] tables."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashbench.errors import CrashbenchError, UsageError
from crashbench.evidence import tally
from crashbench.faults import registry
from crashbench.model.counts import Problem
from crashbench.model.results import DesignRun, Result, counts_unknown_to, jsonable, network_fields_unknown_to
from crashbench.model.spec import Scenario
from crashbench.model.thresholds import ThresholdSyntaxError
from crashbench.model.timeline import Timeline, TimelineError, read
from crashbench.report import store, verdict
from crashbench.run.session import replay_scenario

# What recount compares: everything computed from the timeline, and which run it is (its label is what
# thresholds apply to). Not `workdir` (where the evidence sat when it was measured) nor
# `thresholds_evaluated` (the CI gate's: crashbench.report.verdict compares it).
COMPARED = ("design", "variant", "seed", "repeat", "counts", "timings", "kills", "jobs", "duplicates", "problems",
            "total_queue", "broker_fault", "worker_exits", "network_faults", "schedule", "configuration", "warnings",
            "consumers")  # fmt: skip
# The checks a result that does not reproduce fails, when show and check --results read it.
NOT_REPRODUCED = "not_reproduced"
VERDICT_NOT_REPRODUCED = "verdict_not_reproduced"
SHOWN = 3  # differences a problem's message names; crashbench recount lists them all


@dataclass(slots=True)
class RunRecount:
    index: int
    design: str
    differences: list[str] = field(default_factory=list)  # "counts.lost: saved 3, recounted 2"
    recounted: DesignRun | None = None


def timeline_path(path: Path, result: Result) -> Path:
    if not result.timeline:
        raise UsageError(
            f"{path}: the result names no timeline file (saved before crashbench kept timelines, or written by hand)"
        )
    name = result.timeline
    if Path(name).name != name or name in (".", ".."):  # a file beside the result, never a path elsewhere
        raise UsageError(f"{path}: its timeline must be a file beside it, not {name!r}")
    return path.parent / name


def load(ref: str, directory: Path = store.DEFAULT_DIR) -> tuple[Result, list[Timeline]]:
    """A saved result and its runs' timelines, in the order of its runs."""
    path = store.resolve(ref, directory)
    result = store.load(str(path))
    return result, timelines_of(path, result)


def timelines_of(path: Path, result: Result) -> list[Timeline]:
    """The timelines of the result saved at `path`, in the order of its runs."""
    tpath = timeline_path(path, result)
    try:
        timelines = read(tpath)
    except TimelineError as exc:
        raise UsageError(str(exc)) from None
    if [t.index for t in timelines] != list(range(len(result.runs))):
        raise UsageError(f"{tpath}: holds runs {[t.index for t in timelines]}, the result has {len(result.runs)}")
    return timelines


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(f"{prefix}.{k}", v))
        return out or {prefix: {}}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        out = {}
        for i, v in enumerate(value):
            out.update(_flat(f"{prefix}[{i}]", v))
        return out
    return {prefix: value}


def differences(
    saved: DesignRun, recounted: DesignRun, unknown: Collection[str] = (), unknown_network: Collection[str] = ()
) -> list[str]:
    """What differs between the saved run and the recounted one; `unknown`, `unknown_network`: counts
    and network fault fields the saved file's version does not carry (crashbench.model.results'
    ADDED_COUNTS, ADDED_NETWORK_FIELDS), not compared."""

    def form(run: DesignRun) -> dict[str, Any]:
        data = jsonable(dataclasses.asdict(dataclasses.replace(run, timeline=None)))
        for name in unknown:
            data["counts"].pop(name, None)
        for nf in data["network_faults"]:
            for name in unknown_network:
                nf.pop(name, None)
        return json.loads(json.dumps({k: data[k] for k in COMPARED}))

    a, b = _flat("", form(saved)), _flat("", form(recounted))
    return [
        f"{k.lstrip('.')}: saved {a.get(k, '(none)')!r}, recounted {b.get(k, '(none)')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def scenario_differences(result: Result, tl: Timeline) -> list[str]:
    """The scenario the result carries, as run `tl.index` ran it (its seed, its sweep value), against
    the one the run's timeline recorded: thresholds are evaluated from the result's."""
    try:
        mine = replay_scenario(result, tl.index).to_dict()
        theirs = Scenario.from_dict(tl.scenario).to_dict()
    except (CrashbenchError, ThresholdSyntaxError, TypeError, ValueError) as exc:
        return [f"scenario: cannot be read again: {getattr(exc, 'message', exc)}"]
    return [
        f"scenario.{k}: saved {mine.get(k, '(none)')!r}, timeline {theirs.get(k, '(none)')!r}"
        for k in sorted(mine.keys() | theirs.keys())
        if mine.get(k) != theirs.get(k)
    ]


def recount(result: Result, timelines: list[Timeline]) -> list[RunRecount]:
    out = []
    for tl, saved in zip(timelines, result.runs, strict=True):
        again = tally.design_run(tl, registry.checkers())
        found = differences(
            saved, again, counts_unknown_to(result.schema_version), network_fields_unknown_to(result.schema_version)
        )
        out.append(RunRecount(tl.index, saved.design + (f" {saved.variant}" if saved.variant else ""),
                              found + scenario_differences(result, tl), again))  # fmt: skip
    return out


@dataclass(slots=True)
class Verification:
    """A saved result against its own record: each run recounted (none when it has no timeline to
    recount), and its verdict computed again from those runs, else from its saved ones."""

    runs: list[RunRecount]
    verdict: list[str]  # "status: saved 'pass', recomputed 'fail'"
    unrecounted: str = ""  # why the counts were not recounted: the verdict was checked against them as saved

    @property
    def reproduced(self) -> bool:
        return not self.verdict and not any(r.differences for r in self.runs)


def verify(path: Path, result: Result, store_dir: Path, *, need_timeline: bool = True) -> Verification:
    """Recount the result saved at `path` and compute its verdict again. Without `need_timeline`
    (show, check --results), a result without a readable timeline has its verdict checked against
    its saved runs, and `unrecounted` says why; with it (recount), that is a UsageError."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc})") from None
    try:
        runs = recount(result, timelines_of(path, result))
    except UsageError as exc:
        if need_timeline:
            raise
        saved = [dataclasses.replace(r) for r in result.runs]  # evaluate sets their thresholds_evaluated
        why = f"counts not recounted: {exc.message.removeprefix(f'{path}: ')}"
        return Verification([], verdict.check(path, raw, result, saved, store_dir), why)
    again = [r.recounted for r in runs if r.recounted is not None]
    return Verification(runs, verdict.check(path, raw, result, again, store_dir))


def mark(result: Result, found: Verification) -> None:
    """Each difference as an evidence problem of the result (so its status is broken, exit 4, and
    every report of it says why): a run's on that run, the verdict's on the first run."""

    def problem(check: str, what: str, lines: list[str]) -> Problem:
        more = f" (and {len(lines) - SHOWN} more: crashbench recount lists them)" if len(lines) > SHOWN else ""
        return Problem(check, f"{what}: {'; '.join(lines[:SHOWN])}{more}")

    for r in found.runs:
        if r.differences:
            result.runs[r.index].problems.append(
                problem(NOT_REPRODUCED, "the saved run is not what its timeline gives", r.differences)
            )
    if found.verdict and result.runs:
        source = "its recounted runs" if found.runs else "its saved runs"
        result.runs[0].problems.append(
            problem(VERDICT_NOT_REPRODUCED, f"the saved verdict is not what {source} give", found.verdict)
        )
