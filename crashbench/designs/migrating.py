"""migrating: the guide's Step 6, a live migration from the reliable list queue to a stream ("Migrate by
dual-running: producers write to the stream, stream workers start, and list workers drain the remaining
list backlog").

Two designs side by side under one prefix, each unchanged: reliable (crashbench.designs.reliable) under
P list:, stream (crashbench.designs.stream) under P stream:. A flag decides where the producer's enqueue
goes, read on every enqueue as the guide's `flags.enabled("jobs_on_streams")` is: unset, the list; set
(`flip`, which the migrate fault calls: crashbench.faults.migrate), the stream. A worker is a list worker
or a stream worker by its slot (crashbench.model.queue.SLOT_ENV, which a replacement inherits): even
slots take from the list, odd slots from the stream. The stream workers are deployed with the others and
wait on an empty stream until the flag sends jobs there, as a migration deploys them before it flips. The
harness's instance enqueues, recovers both sides (the list's reaper, the stream's retries and consumer
cleanup) and reports what both hold.

Keys (all under the run prefix P):
    P flag               string: "stream" once the producer writes to the stream; absent before
    P list:<key>         reliable's keys (pending, processing:<worker>, workers, heartbeats, delayed, dead,
                         poisoned, requeued, stats): see crashbench/designs/reliable.py
    P stream:<key>       stream's keys (stream, delayed, dead, poisoned, requeued, stats) and its consumer
                         group "workers": see crashbench/designs/stream.py
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import redis

from crashbench.designs import Design, DesignSettings, Entry, Job, QueueState
from crashbench.designs.reliable import ReliableQueue
from crashbench.designs.stream import StreamQueue
from crashbench.model.queue import SLOT_ENV

FLAG = "flag"
ON = "stream"
LIST, STREAM = "list:", "stream:"


def on_stream(slot: int) -> bool:
    """Whether a worker slot is a stream worker's (odd slots) rather than a list worker's (even slots)."""
    return slot % 2 == 1


class MigratingQueue(Design):
    name = "migrating"
    summary = "reliable and stream side by side, a flag moving the producer from the list to the stream (Step 6)"
    counts_requeues = True  # both sides record what their recovery gives back
    DEAD_LETTERS = (LIST + "dead", STREAM + "dead")
    DELAYED = (LIST + "delayed", STREAM + "delayed")
    BOOKKEEPING = (
        FLAG, *(LIST + k for k in ReliableQueue.BOOKKEEPING), *(STREAM + k for k in StreamQueue.BOOKKEEPING)
    )  # fmt: skip

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.lists = ReliableQueue(client, prefix + LIST, settings)
        self.streams = StreamQueue(client, prefix + STREAM, settings)
        slot = os.environ.get(SLOT_ENV, "")
        # A worker's side, by its slot; the harness's instance (no slot) only enqueues, recovers and reads.
        self.side: Design = self.streams if slot.isdigit() and on_stream(int(slot)) else self.lists

    def flip(self) -> None:
        """Turn the flag on: every enqueue from now on goes to the stream."""
        self.r.set(self.key(FLAG), ON)

    def flipped(self) -> bool:
        return self.r.get(self.key(FLAG)) == ON

    def job_of(self, key: str, entry: Entry) -> str | None:
        if key == STREAM + "dead" and isinstance(entry, bytes):
            return entry.decode(errors="replace")  # the stream's dead letters are bare job ids
        return super().job_of(key, entry)

    def setup(self) -> None:
        self.lists.setup()
        self.streams.setup()

    def enqueue(self, jobs: Sequence[Job]) -> Sequence[str] | None:
        return (self.streams if self.flipped() else self.lists).enqueue(jobs)

    def start_worker(self, worker: str, now: float) -> None:
        self.side.start_worker(worker, now)

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        return self.side.fetch(worker, timeout, now)

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        return self.side.ack(worker, job, now)

    def fail(self, worker: str, job: Job, now: float) -> None:
        self.side.fail(worker, job, now)

    def heartbeat(self, worker: str, job: Job, now: float) -> None:
        self.side.heartbeat(worker, job, now)

    def stop_worker(self, worker: str, now: float) -> None:
        self.side.stop_worker(worker, now)

    def recover(self, now: float) -> int | None:
        gave_back = self.lists.recover(now)
        self.streams.recover(now)
        return gave_back

    def backlog(self) -> int:
        return self.lists.backlog() + self.streams.backlog()

    def state(self) -> QueueState:
        one, two = self.lists.state(), self.streams.state()
        return QueueState(
            held={**{j: LIST + w for j, w in one.held.items()}, **{j: STREAM + w for j, w in two.held.items()}},
            dead_lettered=one.dead_lettered | two.dead_lettered,
            poisoned=one.poisoned | two.poisoned,
            requeued=one.requeued | two.requeued,
            requeue_events=one.requeue_events + two.requeue_events,
        )
