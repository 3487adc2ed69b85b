"""Designs that are wrong on purpose, so the counts they must produce are known in advance.

KnownFaultsQueue, per enqueued job index i:
    i % 10 == 3   dropped at enqueue                  -> lost
    i % 10 == 5   pushed twice                        -> duplicated (2 completions)
    i % 10 == 7   parked in a list no worker reads    -> stranded ("parked")
    i % 10 == 9   put straight into the dead letters  -> dead-lettered
and one job the producer never enqueued ("phantom")  -> unexpected
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from crashbench.designs import Job, QueueState
from crashbench.designs.naive import NaiveQueue
from crashbench.designs.reliable import ReliableQueue


class KnownFaultsQueue(NaiveQueue):
    """The naive queue's fetch and backlog, with an enqueue and a state that misbehave on purpose."""

    name = "known-faults"
    DEAD_LETTERS = ("dead",)
    BOOKKEEPING = ("phantom-sent",)

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            raw = json.dumps({"id": job.id, "payload": job.payload})
            kind = json.loads(job.payload)["n"] % 10  # the id is opaque: the payload carries the number
            if kind == 3:
                continue
            if kind == 7:
                pipe.lpush(self.key("parked"), raw)
            elif kind == 9:
                pipe.lpush(self.key("dead"), raw)
            else:
                pipe.lpush(self.key("pending"), raw)
                if kind == 5:
                    pipe.lpush(self.key("pending"), raw)
        if not self.r.exists(self.key("phantom-sent")):
            pipe.set(self.key("phantom-sent"), 1)
            pipe.lpush(self.key("pending"), json.dumps({"id": "phantom", "payload": ""}))
        pipe.execute()

    def state(self) -> QueueState:
        held = {json.loads(raw)["id"]: "parked" for raw in self.r.lrange(self.key("parked"), 0, -1)}
        held |= {json.loads(raw)["id"]: "pending" for raw in self.r.lrange(self.key("pending"), 0, -1)}
        dead = {json.loads(raw)["id"] for raw in self.r.lrange(self.key("dead"), 0, -1)}
        return QueueState(held=held, dead_lettered=dead)


class FetchRaises(KnownFaultsQueue):
    """Every worker dies on its first fetch: the run must abort cleanly, with the worker's error."""

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        raise RuntimeError("fetch is broken on purpose")


class BacklogRaises(KnownFaultsQueue):
    """The runner's own call fails mid-run: every worker must still be stopped."""

    def backlog(self) -> int:
        raise RuntimeError("backlog is broken on purpose")


class SlowAckQueue(ReliableQueue):
    """The reliable queue with an ack that takes 20 ms: most kills on the clock land after the handler's
    side effect and before the ack, the textbook source of sequential duplicates."""

    def ack(self, worker: str, job: Job, now: float) -> None:
        time.sleep(0.02)
        super().ack(worker, job, now)


class SetupRaises(NaiveQueue):
    """A design whose setup fails: whatever was started for it must be released."""

    name = "setup-raises"

    def setup(self) -> None:
        raise RuntimeError("setup failed on purpose")
