"""`crashbench merge`: the results of `--shard K/N` runs (crashbench.run.shard) put together into the
result the unsharded run gives: every run in the unsharded run's order, each with its timeline
(renumbered to its place), the summary and every threshold evaluated again over all of them, so that
its counts, thresholds, report and recount are the unsharded run's.

A merge is refused (UsageError, exit 2, one line) unless it has every shard of one plan exactly once:
a file that is not a readable shard result, shards of different plans (crashbench's version, the
kind, the scenario's fingerprint or seed, the designs, the repeats, the command line's thresholds or
the baseline differ), a shard given twice, a shard missing. A shard whose runs its own timeline does
not reproduce is refused as recount refuses it (RecountMismatch, exit 4): its counts are not its
record's. The merged result's environment is shard 1's (each shard ran where its CI job did)."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Sequence
from pathlib import Path

from crashbench.errors import RecountMismatch, UsageError
from crashbench.model import thresholds
from crashbench.model.results import SCHEMA, Result, new_id, now_iso, summarize
from crashbench.model.shard import Shard
from crashbench.model.timeline import Timeline
from crashbench.report import recount, store, verdict
from crashbench.run import shard as sharding
from crashbench.run.session import evaluate


@dataclasses.dataclass(slots=True)
class Part:
    path: Path
    result: Result
    shard: Shard
    timelines: list[Timeline]


def shard_files(refs: Sequence[str]) -> list[Path]:
    """The shard results named: a file each, or a directory (searched with its subdirectories, as a
    CI job downloads one artifact per shard) for the crash results in it that are shards; its other
    files (an earlier merge's result, an export) are not."""
    out: list[Path] = []
    for ref in refs:
        path = Path(ref)
        if not path.exists():
            raise UsageError(f"{ref}: no such file or directory")
        if not path.is_dir():
            out.append(path)
            continue
        found = [p for p in sorted(path.rglob("*.json")) if _is_shard(p)]
        if not found:
            raise UsageError(f"{ref}: no shard results in it (result files of a run with --shard K/N)")
        out += found
    return list(dict.fromkeys(p.resolve() for p in out))


def _is_shard(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    # A file that says it is a crash result is read as one (and refused when it is not readable).
    return isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("shard") is not None


def _part(path: Path) -> Part:
    result = store.load(str(path))  # UsageError, one line, when it is not a readable result
    if result.shard is None:
        raise UsageError(f"{path}: not a shard's result (a run without --shard K/N): nothing to merge it with")
    s = result.shard
    if s.runs != sharding.chosen(len(s.entries), result.repeat, s.k, s.n) or len(s.runs) != len(result.runs):
        raise UsageError(f"{path}: shard {s.k}/{s.n} of {s.total} runs, but its runs are not that shard's")
    timelines = recount.timelines_of(path, result)
    bad = [r.index for r in recount.recount(result, timelines) if r.differences]
    if bad:
        raise RecountMismatch(
            f"{path}: run(s) {', '.join(map(str, bad))} not reproduced from its timeline",
            hint=f"crashbench recount {path} lists the differences",
        )
    return Part(path, result, s, timelines)


def _plan(part: Part) -> dict[str, object]:
    """What every shard of one plan shares, by name, for the line that says which differs."""
    r, s = part.result, part.shard
    return {
        "crashbench version": r.environment.crashbench,
        "kind": r.kind,
        "scenario fingerprint": r.fingerprint,
        "seed": r.scenario.get("seed"),
        "designs": [v or d for d, v in s.entries],
        "repeats": r.repeat,
        "shards": s.n,
        "command-line thresholds": s.thresholds,
        "baseline": r.baseline,
        "plan identity": s.plan,
    }


def _check_plan(parts: list[Part]) -> None:
    first, mine = parts[0], _plan(parts[0])
    for part in parts[1:]:
        theirs = _plan(part)
        for what, value in mine.items():
            if theirs[what] != value:
                raise UsageError(
                    f"shards of different plans: {first.path.name} and {part.path.name} differ in {what} "
                    f"({value!r} and {theirs[what]!r})"
                )
    seen: dict[int, Part] = {}
    for part in parts:
        k = part.shard.k
        if k in seen:
            raise UsageError(
                f"shard {k}/{part.shard.n} given twice: {seen[k].path.name} and {part.path.name}",
                hint="give each shard's result once (one run per K)",
            )
        seen[k] = part
    n = first.shard.n
    missing = [k for k in range(1, n + 1) if k not in seen]
    if missing:
        shown = ", ".join(f"{k}/{n}" for k in missing)
        raise UsageError(
            f"missing shard(s) {shown} of plan {first.shard.plan}: given {len(seen)} of {n}",
            hint="give every shard's result (a directory holding them all will do)",
        )


def _baseline(part: Part, given: Result | None, store_dir: Path) -> Result | None:
    wanted = part.result.baseline
    if wanted is None:
        if given is not None:
            raise UsageError(f"--baseline {given.id}: the shards were run without a baseline")
        return None
    if given is not None:
        if given.id != wanted:
            raise UsageError(f"--baseline {given.id}: the shards were checked against {wanted}")
        return given
    found, _ = verdict.baseline_of(part.result, part.path, store_dir)
    if found is None:
        raise UsageError(
            f"the shards were checked against the baseline {wanted}, which is neither beside "
            f"{part.path.name} nor in {store_dir}/",
            hint="give it with --baseline FILE|ID",
        )
    return found


def merge(refs: Sequence[str], store_dir: Path = store.DEFAULT_DIR, baseline: Result | None = None) -> Result:
    """The result the unsharded run gives, from the results of its shards (files or directories)."""
    parts = sorted((_part(p) for p in shard_files(refs)), key=lambda p: p.shard.k)
    _check_plan(parts)
    placed = sorted(
        ((i, run, tl) for p in parts for i, run, tl in zip(p.shard.runs, p.result.runs, p.timelines, strict=True)),
        key=lambda t: t[0],
    )
    runs = []
    for i, run, tl in placed:
        tl.index = i  # its place in the merged result, which recount reads it by
        runs.append(dataclasses.replace(run, timeline=tl, thresholds_evaluated=0))
    first = parts[0]
    try:
        given = [thresholds.parse(t) for t in first.shard.thresholds]
    except thresholds.ThresholdSyntaxError as exc:
        raise UsageError(f"{first.path}: its thresholds: {exc}") from None
    merged = Result(
        id=new_id(secrets.token_hex(4)), kind=first.result.kind, created=now_iso(), scenario=first.result.scenario,
        fingerprint=first.result.fingerprint, runs=runs, environment=first.result.environment,
        repeat=first.result.repeat, summary=summarize(runs), shards=[p.result.id for p in parts],
    )  # fmt: skip
    return evaluate(merged, given, _baseline(first, baseline, store_dir))
