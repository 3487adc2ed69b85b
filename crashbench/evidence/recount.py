"""`crashbench recount`: every count of a saved result computed again from its timeline alone, and
compared with what the result says. The result was computed from the same timeline when it was
measured (crashbench.evidence.tally), so any difference means the saved timeline is not the record the counts
came from: a field lost or changed on its way to disk, or a file edited since."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashbench.errors import UsageError
from crashbench.evidence import tally
from crashbench.evidence.timeline import Timeline, TimelineError, read
from crashbench.report import store
from crashbench.report.results import DesignRun, Result, jsonable

# What recount compares: everything computed from the timeline. Not `workdir` (where the evidence sat
# when it was measured) nor `thresholds_evaluated` (the CI gate's, not the timeline's).
COMPARED = ("counts", "timings", "kills", "jobs", "duplicates", "problems", "total_queue", "broker_fault",
            "worker_exits", "network_faults", "schedule", "configuration", "warnings", "consumers")  # fmt: skip


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
    return path.parent / result.timeline


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


def differences(saved: DesignRun, recounted: DesignRun) -> list[str]:
    def form(run: DesignRun) -> dict[str, Any]:
        data = jsonable(dataclasses.asdict(dataclasses.replace(run, timeline=None)))
        return json.loads(json.dumps({k: data[k] for k in COMPARED}))

    a, b = _flat("", form(saved)), _flat("", form(recounted))
    return [
        f"{k.lstrip('.')}: saved {a.get(k, '(none)')!r}, recounted {b.get(k, '(none)')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def recount(result: Result, timelines: list[Timeline]) -> list[RunRecount]:
    out = []
    for tl, saved in zip(timelines, result.runs, strict=True):
        again = tally.design_run(tl)
        out.append(RunRecount(tl.index, saved.design + (f" {saved.variant}" if saved.variant else ""),
                              differences(saved, again), again))  # fmt: skip
    return out
