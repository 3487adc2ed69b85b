"""Saboteurs: designs that misbehave in known ways, so every count they produce is known in advance,
ids included, and designs whose own report lies, so the evidence checks must catch them.

SaboteurQueue is the reliable queue (which survives kills) with an enqueue that plants, per job id n:
    n % 20 == 3    dropped at enqueue                          -> lost
    n % 20 == 5    pushed twice                                -> duplicated (two completions)
    n % 20 == 7    parked in a list no worker reads, reported  -> stranded at "parked"
    n % 20 == 9    put straight into the dead letters          -> dead-lettered
    n % 20 == 11   hidden in a list state() does not report    -> stranded at "hidden", and the
                                                                  check state_misses names them
and PHANTOMS ids the producer never enqueued                  -> unexpected
Its backlog() counts only pending, delayed and processing, like reliable's: the parked and hidden
jobs are left behind in a "drained" queue; nothing delivers them after the drain, so they are
stranded, not a wrong backlog (ZeroBacklog's workers do deliver after its 0: backlog_wrong).

StopTakesParked parks jobs as SaboteurQueue does, and its workers' graceful stop deletes the parked
list (as saq's stop can leave a job it was sweeping in no list): read before the stop, they are
stranded at "parked", the stop's doing (taken_by_stop), never lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from crashbench.designs import Job, QueueState
from crashbench.designs.naive import NaiveQueue
from crashbench.designs.reliable import ReliableQueue

PHANTOMS = ("p0", "p1", "p2")


def planted(ids: Sequence[str]) -> dict[str, set[str]]:
    """What SaboteurQueue plants among `ids`, by the outcome it must produce."""
    by = {"lost": 3, "duplicated": 5, "parked": 7, "dead_lettered": 9, "hidden": 11}
    return {name: {j for j in ids if int(j) % 20 == r} for name, r in by.items()}


def with_parked(design: ReliableQueue, state: QueueState) -> QueueState:
    """`state` with the jobs of the design's "parked" list reported held there."""
    for raw in design.r.lrange(design.key("parked"), 0, -1):
        state.held[json.loads(raw)["id"]] = "parked"
    return state


class SaboteurQueue(ReliableQueue):
    name = "saboteur"

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            raw = json.dumps({"id": job.id, "payload": job.payload, "attempts": 0})
            r = json.loads(job.payload)["n"] % 20  # the id is opaque: the payload carries the number
            if r == 3:
                continue
            target = {7: "parked", 9: "dead", 11: "hidden"}.get(r, "pending")
            pipe.lpush(self.key(target), raw)
            if r == 5:
                pipe.lpush(self.key("pending"), raw)
        if not self.r.exists(self.key("phantoms-sent")):
            pipe.set(self.key("phantoms-sent"), 1)
            for p in PHANTOMS:
                pipe.lpush(self.key("pending"), json.dumps({"id": p, "payload": "", "attempts": 0}))
        pipe.execute()

    def state(self) -> QueueState:
        return with_parked(self, super().state())  # "hidden" is left out on purpose


class GhostState(NaiveQueue):
    """The naive queue whose state() claims jobs it does not hold, as held and as dead-lettered."""

    name = "ghost-state"
    GHOSTS = ("000010", "000020")
    DEAD_GHOSTS = ("000030",)

    def state(self) -> QueueState:
        state = super().state()
        state.held |= dict.fromkeys(self.GHOSTS, "pending")
        state.dead_lettered |= set(self.DEAD_GHOSTS)
        return state


class ZeroBacklog(ReliableQueue):
    """The reliable queue whose backlog() always says 0, and whose workers dawdle between jobs, so that
    the drain soon finds them all idle: the run "drains" with most jobs still pending."""

    name = "zero-backlog"

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        time.sleep(0.05)
        return super().fetch(worker, timeout, now)

    def backlog(self) -> int:
        return 0


class InflatedRequeues(ReliableQueue):
    """The reliable queue whose state() reports requeued jobs that no requeue event gave back."""

    name = "inflated-requeues"

    def state(self) -> QueueState:
        state = super().state()
        state.requeued |= {"000001", "000002", "000003"}
        return state


class InflatedRequeueEvents(ReliableQueue):
    """The reliable queue whose state() reports a hundred times the requeue events it made."""

    name = "inflated-requeue-events"

    def state(self) -> QueueState:
        state = super().state()
        state.requeue_events = 100 * max(1, state.requeue_events)
        return state


class SilentRequeues(ReliableQueue):
    """The reliable queue whose state() reports no requeue at all, though its reaper gives jobs back."""

    name = "silent-requeues"

    def state(self) -> QueueState:
        state = super().state()
        state.requeued, state.requeue_events = set(), 0
        return state


class PoisonClaims(ReliableQueue):
    """The reliable queue whose state() calls three jobs poison that never failed."""

    name = "poison-claims"

    def state(self) -> QueueState:
        state = super().state()
        state.poisoned |= {"000004", "000005", "000006"}
        return state


class BadLocation(NaiveQueue):
    """state() with a location that is not a string: the run must say so, not crash."""

    name = "bad-location"

    def state(self) -> QueueState:
        state = super().state()
        state.held["000001"] = 42  # type: ignore[assignment]
        return state


class StateRaises(NaiveQueue):
    """state() raises: an unexpected error, never exit 1."""

    name = "state-raises"

    def state(self) -> QueueState:
        raise ZeroDivisionError("state is broken on purpose")


class SpacedId(NaiveQueue):
    """Hands its workers one job whose id holds a space: the ledger refuses to write it."""

    name = "spaced-id"

    def enqueue(self, jobs: Sequence[Job]) -> None:
        super().enqueue(jobs)
        if not self.r.set(self.key("spaced-sent"), 1, nx=True):
            return
        self.r.rpush(self.key("pending"), json.dumps({"id": "a b", "payload": ""}))  # the first one fetched


class StopTakesParked(ReliableQueue):
    """Every job n % 10 == 7 is parked in a list nothing delivers (reported by state()); a worker's
    graceful stop deletes that list."""

    name = "stop-takes-parked"

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            raw = json.dumps({"id": job.id, "payload": job.payload, "attempts": 0})
            parked = json.loads(job.payload)["n"] % 10 == 7
            pipe.lpush(self.key("parked" if parked else "pending"), raw)
        pipe.execute()

    def stop_worker(self, worker: str, now: float) -> None:
        super().stop_worker(worker, now)
        self.r.delete(self.key("parked"))

    def state(self) -> QueueState:
        return with_parked(self, super().state())
