"""The drain policy: after the last fault, how long a run waits for the queue to empty.

Drained: the backlog is 0 and no worker is inside a handler, and it stays so for the design's
`SETTLE_S` (a library that moves jobs back late must have its chance). The run gives up once no
handler has started for `window` seconds (the queue is stuck, or waits on a recovery timeout longer
than the window): a slow queue that still makes progress is not cut off, a stuck one is not waited
on forever. At most 10 windows after the last fault, whatever happens: a drain that hits that bound
while handlers still start is `cut_off`, its backlog undrained rather than stranded.

Progress is a handler starting or the backlog changing: a sweep that takes a dead worker's jobs one
after another, 5 s each, without running them (saq as installed) is still at work, however many it
has to take; the window covers the longest wait between two steps of a recovery, not the whole of it.
In a crash loop (crashbench.run.crashloop) neither counts when it is the loop going round: a crash job
started again is not a start (the runner's `started` leaves it out), and the backlog, which goes up and
down with the loop itself, is not read for progress (`moves` False), so the window ends the loop.

Once drained, the workers keep running for WATCH_S more (`watch`): a handler that starts then, or a
backlog() above 0 again, shows the 0 was wrong (crashbench.evidence.checks: backlog_wrong); jobs still
held that nothing delivers are stranded, the design's own finding.
A delayed workload is never drained before its last job was due, and a scheduler's poll after that
(crashbench.run.collect.last_due): a worker may hold a delayed job in memory, where no reading of
Redis sees it (Dramatiq's delay queue once a broker restart emptied the server).

A run with faults timed from the drain (crashbench.faults: after = "drained") drains twice, before
those faults and after them; the second drain's outcome is the run's. If the first gives up, those
faults are never made (they would meet a busy queue), and its outcome is the run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

BOUND = 10  # windows after the last fault
WATCH_S = 0.2  # seconds the workers keep running after the drain, watched


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
    moves: bool = True,  # a change of the backlog is progress (False: a crash loop's backlog goes round)
    not_before: float = 0.0,  # never drained before this (the last delayed job's due time, and a margin)
) -> Drained:
    next_check = 0.0
    empty_since: float | None = None
    deadline, hard = faults_end + window, faults_end + BOUND * window
    seen, last = started(), -1  # the last backlog read that could tell
    while True:
        # Progress first, then the deadline: a harness that stalled (a loaded machine) while the
        # queue went on must not take its own pause for the queue's quiet.
        tick()
        now = clock()
        if started() != seen:
            seen = started()
            deadline = now + window
        if now >= min(deadline, hard):
            break
        if now >= next_check:
            next_check = now + 0.02
            held = backlog()
            if held >= 0:
                if held != last and last >= 0 and moves:  # a recovery at work without running anything (saq's sweep)
                    deadline = now + window
                last = held
            if busy() or held != 0:
                empty_since = None
            else:
                empty_since = now if empty_since is None else empty_since
                if now - empty_since >= settle and now >= not_before:
                    return Drained(True, False)
        time.sleep(period)
    return Drained(False, deadline > hard)  # a handler started within the last window: still progressing


def watch(
    tick: Callable[[], None],
    clock: Callable[[], float],
    backlog: Callable[[], int],
    until: float,
    period: float = 0.005,
) -> int:
    """Keep the run going until `until`, reading the design's backlog; the most it read (-1: it could
    not tell). The handlers that start meanwhile are in the ledgers."""
    most, next_check = -1, 0.0
    while (now := clock()) < until:
        tick()
        if now >= next_check:
            next_check = now + 0.02
            most = max(most, backlog())
        time.sleep(period)
    return max(most, backlog())
