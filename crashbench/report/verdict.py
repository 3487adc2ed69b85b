"""A saved result's verdict computed again: its summary, every threshold result, how many thresholds
each run was checked against, and its status, from its runs (recounted from the timeline, when it has
one) and the scenario it carries, through the functions a measured run goes through
(crashbench.model.results.summarize, crashbench.run.session.evaluate), and compared with what the
file says. Counts that reproduce prove nothing about a verdict written beside them: a status edited
from fail to pass, or a median edited, would otherwise read as "reproduced" and `show` exit 0.

What the file alone can say, this module cannot check: a threshold given on the command line is
known only from the result (its rule is evaluated again, but one deleted from the file with the
status edited to match is not seen), and a relative threshold is only as good as the baseline found.

Results saved by an older crashbench are read the way their runs are (`compatible`): a field their
file does not have is not compared, nor a count added by a later schema version than the file's
(crashbench.model.results.ADDED_COUNTS); a count their summary lacks reads as the count's default, as a
count their runs lack does; the default thresholds (undrained == 0, ...), which results saved before
them do not list, are left out of the listing of such a file, but not out of its status. The status
is compared as the file states it and as its listed thresholds give it (what show and the gate act
on). A verdict that today's rules give differently is a difference, never adjusted away.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crashbench.errors import CrashbenchError
from crashbench.model.counts import Counts
from crashbench.model.results import DesignRun, Result, Stats, counts_unknown_to, jsonable, summarize
from crashbench.model.thresholds import COUNT_NAMES, Threshold, ThresholdSyntaxError, parse
from crashbench.report import store
from crashbench.run.session import evaluate

DEFAULT_SOURCE = "default"  # crashbench.model.thresholds.defaults: implied, not written by anyone


def command_line(result: Result) -> list[Threshold]:
    """The thresholds the command line gave, as the result lists them: one per design they applied
    to, so each applies to that design alone (check_all then puts them in the same place)."""
    given = [t for t in result.thresholds if t.source == "command line"]
    return [parse(t.threshold, design=t.design, source=t.source) for t in given]


def baseline_of(result: Result, path: Path, store_dir: Path) -> tuple[Result | None, str]:
    """The baseline its relative thresholds were checked against: beside the result, else in the
    store; and, when it is named but found in neither, a line that says so."""
    if result.baseline is None:
        return None, ""
    for directory in dict.fromkeys((path.parent, store_dir)):
        try:
            return store.load(result.baseline, directory), ""
        except CrashbenchError:
            continue
    return None, (
        f"baseline: {result.baseline} is neither beside the result nor in {store_dir}/: "
        "its relative thresholds are computed again without one"
    )


def recompute(result: Result, runs: Sequence[DesignRun], baseline: Result | None) -> Result:
    """The result as a run that measured `runs` would have saved it: a copy, `runs` changed in place
    (their thresholds_evaluated). Raises UsageError where `evaluate` does (a threshold naming a
    design the runs do not have: a file no run wrote)."""
    for run in runs:
        run.thresholds_evaluated = 0
    again = dataclasses.replace(result, runs=list(runs), summary=summarize(runs), thresholds=[])
    return evaluate(again, command_line(result), baseline)


def _form(value: Any) -> Any:
    return json.loads(json.dumps(jsonable(value)))


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(f"{prefix}.{k}", v))
        return out or {prefix: {}}
    return {prefix: value}


def _compare(name: str, saved: Any, again: Any) -> list[str]:
    a, b = _flat(name, _form(saved)), _flat(name, _form(again))
    return [
        f"{k}: saved {a.get(k, '(none)')!r}, recomputed {b.get(k, '(none)')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def _entries(name: str, saved: list[dict[str, Any]], again: list[dict[str, Any]], title: str) -> list[str]:
    """Lists compared entry by entry, each named by its index and what it is (`title`, a format of it)."""
    out = []
    for i in range(max(len(saved), len(again))):
        a, b = (saved[i] if i < len(saved) else None), (again[i] if i < len(again) else None)
        shown = title.format(**(a or b or {}))
        if a is None or b is None:
            out.append(f"{name}[{i}] ({shown}): {'not saved' if a is None else 'saved'}, "
                       f"{'recomputed' if b is not None else 'not recomputed'}")  # fmt: skip
        else:
            out += _compare(f"{name}[{i}] ({shown})", a, b)
    return out


def compatible(saved: Result, again: Result) -> tuple[list[dict], list[dict]]:
    """The saved and recomputed summaries as an older file is read: a count its summary lacks is the
    count's default over the runs (the runs' own counts read so), not a difference."""
    defaults = {f.name: f.default for f in dataclasses.fields(Counts) if f.name in COUNT_NAMES}
    unknown = counts_unknown_to(saved.schema_version)  # counts the file's version never had: not compared
    summary = []
    for s in saved.summary:
        entry = _form(dataclasses.asdict(s))
        for name, default in defaults.items():
            if name not in entry["counts"]:
                entry["counts"][name] = _form(dataclasses.asdict(Stats(default, default, default, s.runs)))
        summary.append(entry)
    theirs = [_form(dataclasses.asdict(s)) for s in again.summary]
    for entry in (*summary, *theirs):
        for name in unknown:
            entry["counts"].pop(name, None)
    return summary, theirs


def differences(raw: dict[str, Any], saved: Result, again: Result) -> list[str]:
    """What the file says (`raw`, and `saved` read from it) against the recomputed verdict (`again`)."""
    out = []
    saved_status = raw.get("status", "(none)")
    if saved_status != again.status:
        out.append(f"status: saved {saved_status!r}, recomputed {again.status!r}")
    # What show and the gate act on is the status the saved thresholds give (and the file's default
    # thresholds, when it predates them, are not among those): the file's own word is not enough.
    if saved.status not in (saved_status, again.status):
        out.append(f"status as the saved thresholds give it: {saved.status!r}, recomputed {again.status!r}")
    mine = [_form(dataclasses.asdict(t)) for t in saved.thresholds]
    theirs = [_form(dataclasses.asdict(t)) for t in again.thresholds]
    if not any(t["source"] == DEFAULT_SOURCE for t in mine):  # saved before the defaults were implied
        theirs = [t for t in theirs if t["source"] != DEFAULT_SOURCE]
    out += _entries("thresholds", mine, theirs, "{design}: {threshold}")
    if "summary" in raw:
        out += _entries("summary", *compatible(saved, again), "{design}")
    for i, (run, a, b) in enumerate(zip(raw.get("runs", []), saved.runs, again.runs, strict=False)):
        if "thresholds_evaluated" in run and a.thresholds_evaluated != b.thresholds_evaluated:
            out.append(f"runs[{i}].thresholds_evaluated: saved {a.thresholds_evaluated}, "
                       f"recomputed {b.thresholds_evaluated}")  # fmt: skip
    return out


def check(path: Path, raw: dict[str, Any], result: Result, runs: Sequence[DesignRun], store_dir: Path) -> list[str]:
    """Every difference between the saved verdict and the one `runs` give; empty when it reproduces."""
    baseline, missing = baseline_of(result, path, store_dir)
    out = [missing] if missing else []
    try:
        again = recompute(result, runs, baseline)
    except (CrashbenchError, ThresholdSyntaxError) as exc:
        message = exc.message if isinstance(exc, CrashbenchError) else str(exc)
        return [*out, f"thresholds: cannot be evaluated again: {message}"]
    return out + differences(raw, result, again)
