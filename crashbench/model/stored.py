"""The harness's own reading of Redis as records: each stored key by its type, a stream's groups,
pending entries and consumers, and the snapshot of a run's keys (crashbench.evidence.inspector reads
them; designs map their entries to jobs). Plain data: nothing here talks to Redis."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Consumer:
    """A consumer a stream's group still holds (XINFO CONSUMERS): a name stays until XGROUP DELCONSUMER."""

    key: str  # the stream's key
    group: str
    name: str
    pending: int  # entries it holds
    idle_ms: int  # since its last read or claim (any attempt, from Redis 7.2 on)
    inactive_ms: int | None = None  # since its last successful read (Redis 7.2+ only; -1: never)


@dataclass(slots=True)
class StreamGroup:
    name: str
    last_delivered: str
    pending: dict[str, str] = field(default_factory=dict)  # entry id -> consumer that holds it
    consumers: list[Consumer] = field(default_factory=list)


@dataclass(slots=True)
class StoredKey:
    name: str
    type: str  # "list" | "set" | "zset" | "hash" | "string" | "stream" | "none" (gone while we looked)
    items: list[bytes] = field(default_factory=list)  # list / set / zset members; a string's value
    fields: dict[bytes, bytes] = field(default_factory=dict)  # hash
    # stream: entry id -> fields, for the entries a group may still owe (see _read_stream)
    entries: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    groups: list[StreamGroup] = field(default_factory=list)
    # stream (XINFO STREAM): its first entry's id (None when empty) and the last id it generated; an
    # entry id below the first was removed from the stream's head: trimmed
    first: str | None = None
    last_generated: str = "0-0"
    length: int = 0

    def stream_places(self) -> Iterator[tuple[str, str, dict[bytes, bytes] | None]]:
        """(where, entry id, fields) for every stream entry a consumer group still owes: not yet
        delivered ("" where) or delivered and pending ("pel:<consumer>"). With no group, every entry is
        waiting. Fields are None for a pending entry whose data is gone (deleted or trimmed)."""
        if not self.groups:
            for eid, fields in self.entries.items():
                yield "", eid, fields
            return
        for group in self.groups:
            last = entry_id(group.last_delivered)
            for eid, fields in self.entries.items():
                if entry_id(eid) > last:
                    yield "", eid, fields
            for eid, consumer in group.pending.items():
                yield f"pel:{consumer}", eid, self.entries.get(eid)


def entry_id(eid: str) -> tuple[int, int]:
    ms, _, seq = eid.partition("-")
    return int(ms), int(seq or 0)


@dataclass(slots=True)
class Snapshot:
    keys: dict[str, StoredKey]
    taken_s: float = 0.0  # how long reading took, for the run's cost

    def consumers(self) -> list[Consumer]:
        """Every consumer of every stream's groups, by key, group and name."""
        return [c for key in self.keys.values() for g in key.groups for c in g.consumers]
