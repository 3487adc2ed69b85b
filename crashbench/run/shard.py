"""`--shard K/N`: a deterministic split of a session's runs across machines, and the identity of the
whole plan each shard records, so that `crashbench merge` (crashbench.report.merge) can put the
shards together into the result the unsharded run gives.

The unsharded run's order is fixed: repeat by repeat, the plan's entries (designs, or sweep values)
in their order within each, so run i is repeat i // len(plan) of entry i % len(plan). The split deals
the runs out like cards, forth and back (shards 1..N, then N..1, ...), entry by entry with each entry's
repeats together: run (entry e, repeat r) is card j = e x repeats + r. Each shard gets as many runs as
another, give or take one; a design's repeats go to different shards before two designs share one, so
a slow design (a library waiting out a 300 s window) spreads over the machines; and dealing back and
forth keeps designs that alternate slow and fast (rq, rq:reliable, celery, ...) from all landing on
the same shards. Dealt round robin in the unsharded order, `make libraries`' 14 designs x 2 seeds on 2
shards would be 57 and 10 minutes of runs (both seeds of every other design on one shard); dealt so,
35 and 32."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

from crashbench import __version__
from crashbench.errors import UsageError
from crashbench.model.results import Result
from crashbench.model.shard import Shard
from crashbench.model.spec import Scenario
from crashbench.model.thresholds import Threshold

_SYNTAX = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse(text: str) -> tuple[int, int]:
    """`K/N` as (k, n); UsageError (exit 2) in one line for anything else."""
    m = _SYNTAX.match(text)
    if not m:
        raise UsageError(f"--shard {text!r}: write K/N, such as 1/3 (shard K of N)")
    k, n = int(m[1]), int(m[2])
    if n < 1:
        raise UsageError(f"--shard {text}: N must be 1 or more")
    if not 1 <= k <= n:
        raise UsageError(f"--shard {text}: K must be 1..{n}")
    return k, n


def dealt(card: int, n: int) -> int:
    """The shard (1..n) card `card` (0-based) goes to, dealing forth and back: 1..n, n..1, 1..n, ..."""
    turn, place = divmod(card, n)
    return place + 1 if turn % 2 == 0 else n - place


def chosen(entries: int, repeat: int, k: int, n: int) -> list[int]:
    """The runs shard k of n holds, as places in the unsharded order, in that order."""
    return [r * entries + e for r in range(repeat) for e in range(entries) if dealt(e * repeat + r, n) == k]


def check(shard: tuple[int, int], total: int) -> None:
    """A shard must hold at least one run: N no more than the plan's runs."""
    k, n = shard
    if n > total:
        raise UsageError(
            f"--shard {k}/{n}: the plan has {total} run(s) (designs or sweep values x repeats), "
            f"so at most {total} shards"
        )


def identity(
    kind: str,
    fingerprint: str,
    seed: int,
    entries: Sequence[tuple[str, str]],
    repeat: int,
    thresholds: Sequence[str],
    baseline: str | None,
) -> str:
    """What every shard of one plan shares, hashed: two shards with the same identity are parts of one run."""
    parts = {
        "crashbench": __version__,
        "kind": kind,
        "fingerprint": fingerprint,
        "seed": seed,
        "entries": [list(e) for e in entries],
        "repeat": repeat,
        "thresholds": list(thresholds),
        "baseline": baseline,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def record(
    shard: tuple[int, int],
    kind: str,
    base: Scenario,
    plan: Sequence[tuple[Scenario, str, str]],
    repeat: int,
    given: Sequence[Threshold],
    baseline: Result | None,
) -> Shard:
    """The record a shard's result carries: which runs of which plan (crashbench.run.session's) it holds."""
    k, n = shard
    entries = [(spec, variant) for _, spec, variant in plan]
    total, rules = len(entries) * repeat, [str(t) for t in given]
    baseline_id = baseline.id if baseline is not None else None
    plan_id = identity(kind, base.fingerprint(), base.faults.seed, entries, repeat, rules, baseline_id)
    return Shard(k, n, plan_id, total, chosen(len(entries), repeat, k, n), [list(e) for e in entries], rules)
