"""The drain policy: after the last fault, how long a run waits for the queue to empty.

Drained: the backlog is 0 and no worker is inside a handler, and it stays so for the design's
`SETTLE_S` (a library that moves jobs back late must have its chance). The run gives up once no
handler has started for `window` seconds (the queue is stuck, or waits on a recovery timeout longer
than the window): a slow queue that still makes progress is not cut off, a stuck one is not waited
on forever. At most 10 windows after the last fault, whatever happens: a drain that hits that bound
while handlers still start is `cut_off`, its backlog undrained rather than stranded.

A run with faults timed from the drain (crashbench.faults: after = "drained") drains twice, before
those faults and after them; the second drain's outcome is the run's. If the first gives up, those
faults are never made (they would meet a busy queue), and its outcome is the run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

BOUND = 10  # windows after the last fault


@dataclass(frozen=True, slots=True)
class Drained:
    drained: bool
    cut_off: bool  # gave up at the bound while handlers still started


def drain(
    tick: Callable[[], None],
    clock: Callable[[], float],
    started: Callable[[], int],  # handler starts so far (the ledgers)
    busy: Callable[[], bool],  # a worker is inside a handler
    backlog: Callable[[], int],  # the design's backlog; -1: it cannot tell (the server is down)
    faults_end: float,
    window: float,
    settle: float,
    period: float = 0.005,
) -> Drained:
    next_check = 0.0
    empty_since: float | None = None
    deadline, hard = faults_end + window, faults_end + BOUND * window
    seen = started()
    while (now := clock()) < min(deadline, hard):
        tick()
        if started() != seen:
            seen = started()
            deadline = now + window
        if now >= next_check:
            next_check = now + 0.02
            if busy() or backlog() != 0:
                empty_since = None
            else:
                empty_since = now if empty_since is None else empty_since
                if now - empty_since >= settle:
                    return Drained(True, False)
        time.sleep(period)
    return Drained(False, deadline > hard)  # a handler started within the last window: still progressing
