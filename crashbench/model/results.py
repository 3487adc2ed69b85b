"""Typed results, serialized to JSON with a schema version and the environment they were measured in."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from crashbench import files
from crashbench.model import timeline
from crashbench.model.counts import Counts, Problem, TotalQueue
from crashbench.model.faults import BrokerFaultRecord as BrokerFaultRecord  # re-exported: results name them
from crashbench.model.faults import Fault as Fault
from crashbench.model.faults import NetworkFaultRecord as NetworkFaultRecord
from crashbench.model.faults import SignalRecord as SignalRecord
from crashbench.model.faults import WorkerExit as WorkerExit
from crashbench.model.faults import broker_fault_name, fault_class, fault_dict
from crashbench.model.shard import Shard
from crashbench.model.stored import Consumer
from crashbench.model.timeline import Timeline

SCHEMA = "crashbench.result"
# 2: repeats, thresholds, result ids, the fault schedule and the machine; 3: redeliveries; 4: each
# network fault's per-slot resume times and the slowest.
SCHEMA_VERSION = 4
READS = (2, 3, 4)  # the versions this crashbench reads
# The counts each version added: a file of an older version never had them, so recount and the
# verdict's check do not compare them (crashbench.report.recount, crashbench.report.verdict).
ADDED_COUNTS = {3: ("redelivered", "redeliveries", "taken_by_stop")}
# The same for the fields of each network fault.
ADDED_NETWORK_FIELDS = {4: ("slot_resume_ms", "slowest_resume_ms")}


def counts_unknown_to(version: int) -> set[str]:
    """The counts a result file of `version` does not carry."""
    return {name for v, names in ADDED_COUNTS.items() if v > version for name in names}


def network_fields_unknown_to(version: int) -> set[str]:
    """The network fault fields a result file of `version` does not carry."""
    return {name for v, names in ADDED_NETWORK_FIELDS.items() if v > version for name in names}


@dataclass(slots=True)
class Timings:
    wall_s: float  # first worker started -> drained
    jobs_per_s: float  # done / wall_s
    ideal_s: float  # the sum of all handler durations / workers
    drained: bool  # False: the drain timeout ran out with jobs still held
    drain_s: float  # last fault -> drained (or gave up)
    window_s: float  # the observation window after the last fault (run.drain_timeout or the design's default)
    startup_ms_median: float  # worker spawn -> READY
    startup_ms_max: float
    restart_ms_median: float | None  # kill -> replacement READY
    recovery_ms_p50: float | None = None  # fault -> next start of the job it interrupted; inf: never
    recovery_ms_p95: float | None = None
    recovery_ms_max: float | None = None
    inspect_s: float = 0.0  # the harness reading Redis for its evidence (crashbench.evidence.inspector)
    # a delayed workload (workload.delay_s): due (enqueue + delay, harness clock) -> the job's first start
    delay_lateness_ms_p50: float | None = None
    delay_lateness_ms_p95: float | None = None
    delay_lateness_ms_max: float | None = None
    cut_off: bool = False  # the drain hit its bound (10 windows) while handlers still started: undrained

    @property
    def ratio_to_ideal(self) -> float:
        return self.wall_s / self.ideal_s if self.ideal_s else 0.0


@dataclass(slots=True)
class ThresholdResult:
    design: str  # the design (or sweep value) it was evaluated on
    threshold: str  # as written, without the design: "lost == 0", "recovery_p95 < 2000"
    source: str  # "scenario", "command line", or "default" (undrained / worker_crashes == 0, implied)
    status: str  # "pass" | "fail" | "inconclusive"
    actual: float | None  # the value checked (the failing or the worst run's; a statistic over repeats)
    expected: float | None  # the bound it was checked against (resolved: a count, a baseline-relative value)
    unit: str = ""
    baseline: float | None = None  # the baseline's value, for a relative threshold
    values: list[float | None] = field(default_factory=list)  # the metric in each run (repeat)
    note: str = ""

    @property
    def met(self) -> bool:
        return self.status == "pass"


@dataclass(slots=True)
class DesignRun:
    design: str
    variant: str  # what a sweep set for this run ("stale_after=0.5"); "" otherwise
    prefix: str
    seed: int
    counts: Counts
    timings: Timings
    kills: list[SignalRecord]
    repeat: int = 0  # which repeat of the scenario this run is (0-based); its seed is the scenario's + repeat
    schedule: list[Fault] = field(default_factory=list)  # the fault schedule the seed gave
    broker_fault: BrokerFaultRecord | None = None
    worker_exits: list[WorkerExit] = field(default_factory=list)
    network_faults: list[NetworkFaultRecord] = field(default_factory=list)  # each, and how the queue came back
    duplicates: dict[str, int] = field(default_factory=dict)  # job -> completions, jobs run twice or more (first 100)
    # outcome class (lost, stranded, undrained, ...) or library_disagrees -> its ids (the first 100)
    jobs: dict[str, list[str]] = field(default_factory=dict)
    workdir: str | None = None  # with --keep (or after a failed check): the ledgers and worker logs
    problems: list[Problem] = field(default_factory=list)  # evidence checks that failed (crashbench.evidence.checks)
    total_queue: TotalQueue | None = None  # the counts in Jepsen's total-queue vocabulary
    thresholds_evaluated: int = 0  # set by the CI gate: thresholds that applied to this run's design
    # A library adapter's settings in effect that decide recovery (timeouts, concurrency), and what in
    # them would re-run or cancel a healthy job of this workload (said before the run, too).
    configuration: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The consumers the streams' groups still held at the harness's final reading, with their idle times.
    consumers: list[Consumer] = field(default_factory=list)
    # Everything the run recorded, which the counts above were computed from; saved in its own file
    # beside the result (Result.timeline), never in the JSON.
    timeline: Timeline | None = field(default=None, repr=False, compare=False)


def label(run: DesignRun) -> str:
    """How a run's design is named in tables and threshold results: the sweep value, else the design."""
    return run.variant or run.design


def group(runs: Sequence[DesignRun]) -> dict[str, list[DesignRun]]:
    """Runs by label, in first-seen order: the repeats of one design (or one sweep value) together."""
    out: dict[str, list[DesignRun]] = {}
    for run in runs:
        out.setdefault(label(run), []).append(run)
    return out


def number(v: float) -> str:
    """A count as a whole number, anything else with two decimals."""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def spread(values: Sequence[float | None], fmt: Callable[[float], str] = number, dash: str = "-") -> str:
    """One run: its value. Repeats: the median, and (min-max) when they differ; "-" when none exist."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    med = statistics.median(present)
    lo, hi = min(present), max(present)
    return fmt(med) if lo == hi else f"{fmt(med)} ({fmt(lo)}{dash}{fmt(hi)})"


@dataclass(slots=True)
class Stats:
    min: float
    median: float
    max: float
    n: int  # runs that had a value (a timing may have none, like a recovery time without recoveries)


@dataclass(slots=True)
class DesignSummary:
    """One design's (or sweep value's) runs over the repeats: min / median / max of every count and timing."""

    design: str
    runs: int
    counts: dict[str, Stats]
    timings: dict[str, Stats]


def _stats(values: Sequence[float | None]) -> Stats | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Stats(min(present), round(statistics.median(present), 4), max(present), len(present))


def summarize(runs: Sequence[DesignRun]) -> list[DesignSummary]:
    out = []
    count_names = [f.name for f in dataclasses.fields(Counts) if f.name != "stranded_at"]
    timing_names = [f.name for f in dataclasses.fields(Timings) if f.name not in ("drained", "cut_off")]
    for name, design_runs in group(runs).items():
        counts = {c: s for c in count_names if (s := _stats([getattr(r.counts, c) for r in design_runs]))}
        timings = {t: s for t in timing_names if (s := _stats([getattr(r.timings, t) for r in design_runs]))}
        out.append(DesignSummary(name, len(design_runs), counts, timings))
    return out


@dataclass(slots=True)
class Environment:
    crashbench: str
    python: str
    redis_py: str
    platform: str
    machine: str  # host name
    cpus: int
    server_name: str
    server_version: str
    server_binary: str | None
    # "embedded" | "external" | "cluster" (embedded) | "external-cluster" | "sentinel" | "external-sentinel"
    server_mode: str
    commit: str | None
    dirty: bool | None
    libraries: dict[str, str] = field(default_factory=dict)  # queue library -> version, where workers import it
    worker_python: str | None = None  # --worker-python, whose versions `libraries` then gives (and "python")
    library_pythons: dict[str, str] = field(default_factory=dict)  # --worker-python LIB=PATH: that library's
    server_primaries: int = 0  # a cluster's primaries serving slots and its replicas in all; 0 for one server
    server_replicas: int = 0
    server_url: str | None = None  # where the run's clients connected, its password masked
    server_db: int = 0

    def server_line(self) -> str:
        """The server and database a run used, for the line under its table."""
        where = f" at {self.server_url}" if self.server_url else ""
        return f"{self.server_name} {self.server_version} ({self.server_mode}){where}, db {self.server_db}"


@dataclass(slots=True)
class Result:
    id: str  # "<date>-<time>-<run id>": the start of its file name in a results directory
    kind: str  # "run" | "compare" | "sweep" | "check"
    created: str
    scenario: dict[str, Any]
    fingerprint: str  # of the scenario, without its name and seed: results of the same experiment share it
    runs: list[DesignRun]  # every run, repeats included, in the order they ran
    environment: Environment
    repeat: int = 1
    summary: list[DesignSummary] = field(default_factory=list)  # per design over the repeats
    thresholds: list[ThresholdResult] = field(default_factory=list)
    baseline: str | None = None  # the id of the result relative thresholds were checked against
    timeline: str | None = None  # the file, beside this one, that holds every run's timeline
    shard: Shard | None = None  # a --shard K/N run: which runs of which plan it holds (crashbench merge)
    shards: list[str] = field(default_factory=list)  # a merged result: the ids of its shards, 1..N
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    @property
    def problems(self) -> list[Problem]:
        return [p for r in self.runs for p in r.problems]

    @property
    def status(self) -> str:
        """By precedence: broken (an evidence check failed, so no count can be trusted), fail (a
        threshold was violated), inconclusive (a threshold had no value), unchecked (a design, or
        sweep value, to which no threshold applied), else pass."""
        if self.problems:
            return "broken"
        if any(t.status == "fail" for t in self.thresholds):
            return "fail"
        if any(t.status == "inconclusive" for t in self.thresholds):
            return "inconclusive"
        checked = {t.design for t in self.thresholds}
        if any(name not in checked for name in group(self.runs)):
            return "unchecked"
        return "pass"

    def to_dict(self) -> dict[str, Any]:
        bare = dataclasses.replace(self, runs=[replace(r, timeline=None) for r in self.runs])  # no deep copy of it
        data = jsonable(dataclasses.asdict(bare))
        for raw in data["runs"]:
            del raw["timeline"]
        for run, raw in zip(self.runs, data["runs"], strict=True):
            raw["timings"]["ratio_to_ideal"] = round(run.timings.ratio_to_ideal, 4)
            raw["schedule"] = jsonable([fault_dict(f) for f in run.schedule])  # every kind's keys, as ever
        data["status"] = self.status
        # schema first: a reader should know what it holds before anything else
        return {"schema": data.pop("schema"), "schema_version": data.pop("schema_version"), **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def file_name(self) -> str:
        """Every part a slug: a scenario named "../../x" must not write outside --out, nor a long one
        make a name the file system refuses."""
        names = "-".join(dict.fromkeys(r.design.replace(":", "_").replace(".", "_") for r in self.runs))
        part = f"-shard{self.shard.k}of{self.shard.n}" if self.shard is not None else ""
        return f"{slug(self.id)}-{slug(self.kind)}-{slug(str(self.scenario['name']))}-{slug(names, 60)}{part}.json"

    def write(self, out: Path) -> Path:
        """Write to `out` (a .json file, or a directory to put it in under its own name)."""
        if out.suffix != ".json":
            out = out / self.file_name()
        out.parent.mkdir(parents=True, exist_ok=True)
        timelines = [r.timeline for r in self.runs if r.timeline is not None]
        with files.locked(out.parent):  # two runs may share an --out: the pair is one run's
            if timelines:
                self.timeline = timeline.write(timelines, out.with_name(out.stem + ".timeline.jsonl.gz")).name
            with files.replacing(out) as tmp:  # whole or not at all
                tmp.write_text(self.to_json() + "\n")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError("not a crashbench result")
        if data.get("schema_version") not in READS:
            raise ValueError(f"schema version {data.get('schema_version')}; this crashbench reads {list(READS)}")
        return _build(cls, data)


def jsonable(data: Any) -> Any:
    """JSON has no infinity: a recovery that never happened is written "inf" (read back by _build)."""
    if isinstance(data, float) and math.isinf(data):
        return "inf" if data > 0 else "-inf"
    if isinstance(data, dict):
        return {k: jsonable(v) for k, v in data.items()}
    if isinstance(data, list):
        return [jsonable(v) for v in data]
    return data


def slug(text: str, limit: int = 40) -> str:
    """A file-name part: only [A-Za-z0-9._-], no leading dot, at most `limit` characters."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).lstrip(".")[:limit] or "_"


def new_id(run_id: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime()) + "-" + run_id


class ResultFormatError(ValueError):
    """A result file whose JSON does not have the shape of a result: it names the field."""


def _build(tp: Any, data: Any, where: str = "result") -> Any:
    """A typed value from its JSON form, following the dataclasses' annotations (fields added by
    `to_dict`, like `status`, are ignored). A file is input: every value is checked against its type,
    and the first that does not fit is named (ResultFormatError)."""

    def wrong(expected: str) -> ResultFormatError:
        return ResultFormatError(f"{where}: expected {expected}, got {type(data).__name__}")

    if tp is Fault:  # the union of fault specs: the record of its kind
        if not isinstance(data, dict) or not isinstance(data.get("kind", "signal"), str):
            raise wrong("a fault")
        kind = str(broker_fault_name(data.get("kind", "signal")))
        tp, data = fault_class(kind), {**data, "kind": kind}
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise wrong("an object")
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        return tp(**{k: _build(hints[k], v, f"{where}.{k}") for k, v in data.items() if k in names})
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if data is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], data, where) if len(inner) == 1 else data
    if origin in (list, tuple):  # list[X], tuple[X, ...]
        if not isinstance(data, list):
            raise wrong("a list")
        built = [_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(data)]
        return built if origin is list else tuple(built)
    if origin is dict:
        if not isinstance(data, dict):
            raise wrong("an object")
        return {k: _build(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            raise wrong("a number")
        try:
            return float(data)  # "inf" (jsonable)
        except ValueError:
            raise wrong("a number") from None
    if tp is int and (isinstance(data, bool) or not isinstance(data, int)):
        raise wrong("a whole number")
    if tp is bool and not isinstance(data, bool):
        raise wrong("true or false")
    if tp is str and not isinstance(data, str):
        raise wrong("a string")
    return data


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime())
