"""Where the harness found each job in its own reading of Redis, and how a stored key's entries are
walked: the vocabulary `Design.locate` answers in (crashbench.evidence.inspector reads, a design maps)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from crashbench.evidence.inspector import Consumer, StoredKey, entry_id
from crashbench.jobids import canonical

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

    def add(self, job: str, where: str, kind: str = "held") -> None:
        """kind: "held", "delayed" (held, waiting for its due time), "dead", "failed" or "succeeded". The
        id as the queue stores it: the run's token is stripped here (crashbench.jobids)."""
        job = canonical(job)
        if kind == "dead":
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
