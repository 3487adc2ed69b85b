"""The values a design takes and gives: a job, the settings every design may read, the queue's own
report of what it holds, the error that makes an enqueue indeterminate; and where the harness found
each job in its own reading of Redis (`Located`, the vocabulary `Design.locate` answers in), with how
a stored key's entries are walked. Re-exported by crashbench.designs, where designs import them from."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from crashbench.errors import RunAborted
from crashbench.jobids import canonical
from crashbench.model.stored import Consumer, StoredKey, entry_id

OBSERVE_DEFAULT = 30.0  # seconds; the built-in designs recover within stale_after + recover_every
OBSERVE_CAP = 300.0  # a library documenting an hour is still given at most this much unless asked
OBSERVE_MARGIN = 10.0  # beyond a library's documented redelivery time: its sweep's period, scheduling
# The worker slot a worker process fills, in its environment (crashbench.control.supervisor sets it): a
# replacement starts in its predecessor's slot under a new worker name.
SLOT_ENV = "CRASHBENCH_SLOT"


def observe_for(documented_s: float) -> float:
    """The default observation window for a library that documents redelivery after `documented_s`."""
    return min(OBSERVE_CAP, documented_s + OBSERVE_MARGIN)


class EnqueueUnconfirmed(Exception):
    """The server took the enqueue but could not confirm it durable as asked (WAIT timed out): the
    producer must count it indeterminate, not acknowledged."""


# What a design's enqueue may return: one receipt per job, in order (a stream's entry ids, XADD's
# replies), or None. The timeline keeps them, so that the harness's reading at the end can tell an
# entry the server no longer holds (crashbench.evidence.trim).
Receipts = tuple[str, ...] | None


def receipts(value: object, ids: Sequence[str], design: str) -> Receipts:
    """A design's enqueue return value as Receipts; anything but None or one string per job is its bug."""
    if value is None:
        return None
    if isinstance(value, list | tuple) and len(value) == len(ids) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise RunAborted(
        f"{design}: enqueue must return None or one receipt string per job ({len(ids)}), not {value!r:.80}"
    )


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of work. `id` is unique per run; `receipt` is whatever `ack` needs (design-private)."""

    id: str
    payload: str = ""
    receipt: Any = None
    attempt: int = 1  # which attempt this delivery is (1 = first), as far as the design knows
    delay_s: float = 0.0  # seconds after its enqueue the job is due ([workload] delay_s; a design with `delays`)


@dataclass(frozen=True, slots=True)
class DesignSettings:
    """Knobs every design may read; a design ignores those it has no use for."""

    stale_after: float = 1.0  # seconds without a heartbeat / idle before recovery takes a job back
    recover_every: float = 0.25  # seconds between recovery passes (reaper loop, XAUTOCLAIM)
    max_attempts: int = 3  # deliveries of one job before it is dead-lettered
    retry_base: float = 0.1  # delay before the first retry of a failed job, seconds
    retry_factor: float = 4.0  # each further retry waits this many times longer
    retry_jitter: float = 0.25  # plus up to this fraction of the delay, at random
    heartbeat_every: float = 0.0  # heartbeat inside long handlers every this many seconds; 0 = between jobs only
    batch_size: int = 10  # jobs a batching design moves per round trip (fetch_batch); others ignore it
    shards: int = 0  # queues a sharding design spreads its jobs over; 0 = its own default; others ignore it
    # The stream designs' XADD MAXLEN (0: never trim) and whether it is MAXLEN ~ (approximate); others ignore it.
    stream_maxlen: int = 0
    stream_approximate: bool = False
    concurrency: int = 0  # handlers one library worker runs at once; 0 = the library's shipped default
    longest_job: float = 0.0  # seconds: the workload's longest handler, what a library's timeouts must exceed
    delayed: bool = False  # the workload delays jobs (workload.delay_s): a library's scheduler must run
    wait_replicas: int = 0  # after an enqueue, WAIT for this many replicas (designs that support it)
    wait_aof: int = 0  # after an enqueue, WAITAOF for the server's own fsync of it (designs that support it)
    wait_ms: int = 100
    # crashbench's own workers: socket and connect timeout of their connection, seconds;
    # longer than their blocking pop, so a half-open connection becomes a reconnect, not a hang. 0: none.
    socket_timeout: float = 5.0
    # Library adapters: the user's own app and task ([app]; crashbench.designs.app), else crashbench's handler.
    app: str = ""
    task: str = ""
    # Library adapters: the scenario's [library."<design>"] table, passed to the library as its settings.
    options: dict[str, Any] = field(default_factory=dict)

    def retry_delay(self, attempt: int, u: float) -> float:
        """Backoff after failed attempt number `attempt`; `u` in [0, 1) draws the jitter."""
        base = self.retry_base * self.retry_factor ** (attempt - 1)
        return base * (1 + self.retry_jitter * u)


@dataclass(slots=True)
class QueueState:
    """What the queue holds at the end, by job id: the evidence behind stranded / dead-lettered / requeued."""

    held: dict[str, str] = field(default_factory=dict)  # job id -> where ("pending", "processing:w3", ...)
    dead_lettered: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # the queue recorded these as failed (a library's failed registry)
    poisoned: set[str] = field(default_factory=set)  # dead-lettered because the handler kept failing
    requeued: set[str] = field(default_factory=set)  # ids recovery gave back at least once
    requeue_events: int = 0  # how many times recovery gave a job back, in all

    def canonical(self) -> QueueState:
        """The same report with every id as crashbench spells it (the run's token stripped: crashbench.jobids)."""
        c = canonical

        def ids(s: set[str]) -> set[str]:
            return {c(j) if isinstance(j, str) else j for j in s}

        held = {c(j) if isinstance(j, str) else j: w for j, w in self.held.items()}
        return QueueState(
            held, ids(self.dead_lettered), ids(self.failed), ids(self.poisoned), ids(self.requeued), self.requeue_events
        )


Entry = bytes | dict[bytes, bytes]  # a stored member / value, or a stream entry's fields


@dataclass(slots=True)
class StreamEnd:
    """What the harness read of a stream besides its jobs: its first entry's id (None: empty), the last
    id it generated, its length, and the pending entries whose data is gone (trimmed while pending)."""

    first: str | None
    last_generated: str
    length: int
    gone: list[str] = field(default_factory=list)

    def removed(self, eid: str) -> bool:
        """Whether entry `eid`, which the stream generated, is no longer in it by position: below its first
        entry, or any entry of an empty stream. Entries leave the head only by trimming (or XDEL)."""
        if entry_id(eid) > entry_id(self.last_generated):
            return False  # never generated here: not a receipt of this stream
        return self.first is None or entry_id(eid) < entry_id(self.first)

    @classmethod
    def of(cls, key: StoredKey) -> StreamEnd:
        gone = sorted({eid for where, eid, fields in key.stream_places() if where and fields is None}, key=entry_id)
        return cls(key.first, key.last_generated, key.length, gone)


@dataclass(slots=True)
class Located:
    """Where the harness found each job in its own reading of Redis (crashbench.evidence.inspector)."""

    held: dict[str, list[str]] = field(default_factory=dict)  # job -> every place a copy sits (not dead)
    dead: dict[str, list[str]] = field(default_factory=dict)  # job -> the dead-letter places it sits in
    delayed: set[str] = field(default_factory=set)  # held jobs that only wait for a retry's due time
    failed: set[str] = field(default_factory=set)  # the library recorded these failed (its failed registry)
    succeeded: set[str] = field(default_factory=set)  # the library recorded these done (a result, a registry)
    streams: dict[str, StreamEnd] = field(default_factory=dict)  # stream key (without the prefix) -> its end
    # The streams' consumers as the harness read them (crashbench.evidence.inspector), never the design's
    # word: set by the runner from the same snapshot, whatever `locate` returned.
    consumers: list[Consumer] = field(default_factory=list)
    # Held when the harness read Redis before stopping the workers, found nowhere after and never
    # completed: counted where they were held before (`carry`); the stop's doing, not the queue's.
    stopped: set[str] = field(default_factory=set)
    # Named by an entry whose job body is gone (an RQ id whose job hash was evicted): nothing can run
    # them, so they are held nowhere (lost, unless done); the harness's search, which finds the id in
    # the entry, takes them as accounted for. Read once, at the final reading; not in the timeline.
    void: set[str] = field(default_factory=set)

    def add(self, job: str, where: str, kind: str = "held") -> None:
        """kind: "held", "delayed" (held, waiting for its due time), "dead", "failed", "succeeded" or
        "void". The id as the queue stores it: the run's token is stripped here (crashbench.jobids)."""
        job = canonical(job)
        if kind == "void":
            self.void.add(job)
        elif kind == "dead":
            self.dead.setdefault(job, []).append(where)
        elif kind == "failed":
            self.failed.add(job)
        elif kind == "succeeded":
            self.succeeded.add(job)
        else:
            self.held.setdefault(job, []).append(where)
            if kind == "delayed":
                self.delayed.add(job)


def carry(before: Located, after: Located, done: Callable[[str], bool]) -> Located:
    """`after` (the reading once the workers are stopped), with every job `before` held or dead-lettered
    that `after` has nowhere and that never completed (`done`: the ledger saw it end) put back where
    `before` found it, and named in `stopped`."""
    anywhere = after.held.keys() | after.dead.keys() | after.failed | after.succeeded
    for job, places in before.held.items():
        if job not in anywhere and not done(job):
            after.held[job] = list(places)
            after.stopped.add(job)
            if job in before.delayed:
                after.delayed.add(job)
    for job, places in before.dead.items():
        if job not in anywhere and not done(job):
            after.dead[job] = list(places)
            after.stopped.add(job)
    return after


def matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def key_entries(key: StoredKey, rel: str) -> Iterator[tuple[str, Entry]]:
    """(where, entry) for every entry of a key that can hold a job: list / set / sorted-set members,
    hash values, a string's value, and the stream entries a consumer group still owes."""
    if key.type == "stream":
        for where, _, fields in key.stream_places():
            if fields is not None:
                yield where or rel, fields
        return
    values = key.fields.values() if key.type == "hash" else key.items
    for v in values:
        yield rel, v
