"""The queue's depth as the harness reads it, for the timeline's depth chart: how many jobs wait
(held, not delayed, not inside a handler by the ledgers), how many wait for a retry's due time, how
many are dead-lettered.

A design whose `locate` is the default reads each key's entries on their own, so its keys are read a
piece at a time (crashbench.evidence.inspector.pieces) and only counted: a reading of a million waiting
jobs costs a byte per job, not the ~250 bytes that holding the whole reading did. A job found in two
places counts where it was found first (the full reading would count it once too, as delayed if either
place is). A library's `locate` may join keys, so its reading is taken whole, as for the counts.
"""

from __future__ import annotations

import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import redis

from crashbench import jobids
from crashbench.designs import Design
from crashbench.evidence import inspector


@dataclass(frozen=True, slots=True)
class Reading:
    pending: int
    delayed: int
    dead: int
    taken_s: float


def read(design: Design, raw: redis.Redis, inside: AbstractSet[str]) -> Reading:
    started = time.perf_counter()
    patterns = design.key_patterns()
    if type(design).locate is not Design.locate:
        located = design.locate(inspector.take(raw, patterns))
        pending = sum(1 for j in located.held if j not in located.delayed and j not in inside)
        return Reading(pending, len(located.delayed), len(located.dead), time.perf_counter() - started)
    held, dead = jobids.Marks(), jobids.Marks()
    pending = delayed = dead_n = 0
    for piece in inspector.pieces(raw, patterns):
        found = design.locate(inspector.Snapshot({piece.name: piece}))
        for j in found.held:
            if held.add(jobids.code(j)):
                if j in found.delayed:
                    delayed += 1
                elif j not in inside:
                    pending += 1
        dead_n += sum(1 for j in found.dead if dead.add(jobids.code(j)))
    return Reading(pending, delayed, dead_n, time.perf_counter() - started)
