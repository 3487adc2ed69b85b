"""The harness's reading of Redis at a run's end, taken twice: once before anything is stopped, with
the workers still up and the queue as the run left it, and once after they are stopped and the
design's recovery has run. Stopping a library's worker can itself take a job out of every list (saq's
stop cancels its sweep in the sweep's 5 s wait, leaving the job "aborting" nowhere): a job held before
the stop and found nowhere after, and never completed, counts where it was held before
(crashbench.model.queue.carry). The harness never causes what it counts.

Each reading is the design's own (`locate` over its declared keys), corrected by the harness's search
of everything in scope for the run's token (crashbench.evidence.keyspace)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from crashbench.designs import Design
from crashbench.evidence import inspector, keyspace
from crashbench.evidence.search import Needle
from crashbench.model.counts import Problem
from crashbench.model.queue import Located


@dataclass(slots=True)
class Reading:
    located: Located
    problems: list[Problem]  # where the harness's search and the design's reading disagree
    snapshot: inspector.Snapshot  # the design's declared keys as read
    spent_s: float  # the time it took


def locate(design: Design, raw: redis.Redis) -> tuple[Located, inspector.Snapshot]:
    """The design's reading of its declared keys, with the streams' consumers as the harness read them."""
    snapshot = inspector.take(raw, design.key_patterns())
    return dataclasses.replace(design.locate(snapshot), consumers=snapshot.consumers()), snapshot


def final(
    design: Design, raw: redis.Redis, needle: Needle, scope: keyspace.Scope, url: str, done: Callable[[str], bool]
) -> Reading:
    """The design's reading, corrected by the search for the run's token. `done`: the ledger saw it complete."""
    located, snapshot = locate(design, raw)
    started = time.perf_counter()
    pool = getattr(raw, "connection_pool", None)  # a cluster client has none, and database 0 only
    run_db = int(pool.connection_kwargs.get("db", 0) or 0) if pool is not None else 0
    found = keyspace.search(design, needle, snapshot, scope, url, run_db)
    per_entry = type(design).locate is Design.locate
    located, problems = keyspace.reconcile(located, found, done, per_entry)
    return Reading(located, problems, snapshot, snapshot.taken_s + time.perf_counter() - started)
