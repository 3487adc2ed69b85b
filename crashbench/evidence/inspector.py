"""The inspector: the harness's own reading of Redis, which no design under test controls.

After the final recovery pass (and at a broker fault) the runner SCANs the run's key patterns on its
own connection and reads every key by its type: list, set and sorted-set members, hash fields,
string values, and stream entries with each consumer group's last-delivered id, pending entries
(the PEL) and consumers (XINFO CONSUMERS: every name the group still holds, its pending count and
idle time, which no design reports about itself). The design then only says how a stored entry maps
to a job id (`Design.job_of`, or `Design.locate` for a library's layout); where each job sits, how
many times, and whether it is there at all is decided from this snapshot, not from the design's own
`state()`.

Values are kept as bytes: some libraries store pickles.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis

from crashbench.model.stored import Consumer, Snapshot, StoredKey, StreamGroup, entry_id

CHUNK = 10_000  # members / entries per round trip for big keys
BATCH = 1_000  # keys per pipeline for small keys
SIZE = {"list": "llen", "set": "scard", "zset": "zcard", "hash": "hlen"}


def take(client: redis.Redis, patterns: Sequence[str]) -> Snapshot:
    """Every key matching `patterns` (SCAN MATCH), read in full. `client` must not decode responses."""
    started = time.perf_counter()
    listed = listing(client, patterns)
    keys: dict[str, StoredKey] = {}
    for i in range(0, len(listed), BATCH):
        keys |= _read_batch(client, listed[i : i + BATCH])
    return Snapshot(keys, time.perf_counter() - started)


def _read_batch(client: redis.Redis, listed: list[tuple[bytes, str, str]]) -> dict[str, StoredKey]:
    """The keys read as `_read` reads them, in their listed order, the small ones in a few pipelines:
    a library keeps a hash per job and a stream of results per job, and a round trip per key costs
    seconds for a thousand jobs on a loaded machine, time the runner's loop (which makes the faults)
    would spend waiting. A list, set, sorted set or hash of at most CHUNK entries, a string, and a
    stream of at most CHUNK entries with no consumer group are read so; the others, and a key whose
    type changed meanwhile, on their own."""
    got: dict[str, StoredKey] = {}
    changed: set[str] = set()

    def pipelined(keys: list[tuple[bytes, str, str]], command: Callable[[Any, bytes, str], None]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name, _, kind in keys:
            command(pipe, name, kind)
        replies = pipe.execute(raise_on_error=False)
        changed.update(text for (_, text, _), reply in zip(keys, replies, strict=True) if isinstance(reply, Exception))
        return replies

    sized = [k for k in listed if k[2] in SIZE or k[2] == "stream"]
    sizes = dict(zip((t for _, t, _ in sized), pipelined(sized, _size), strict=True))
    streams = [k for k in sized if k[2] == "stream" and k[1] not in changed]
    groups = dict(zip((t for _, t, _ in streams), pipelined(streams, lambda p, n, _: p.xinfo_groups(n)), strict=True))
    small = [
        (name, text, kind)
        for name, text, kind in listed
        if text not in changed
        and (kind == "string" or (text in sizes and _length(sizes[text]) <= CHUNK and not groups.get(text)))
    ]
    for (_, text, kind), reply in zip(small, pipelined(small, _whole), strict=True):
        if isinstance(reply, Exception):
            continue
        key = got[text] = StoredKey(text, kind)
        if kind == "hash":
            key.fields = reply
        elif kind == "string":
            key.items = [] if reply is None else [reply]
        elif kind == "stream":
            info = sizes[text]
            first = info.get("first-entry")
            key.first = _text(first[0]) if first else None
            key.last_generated, key.length = _text(info["last-generated-id"]), int(info["length"])
            key.entries = {_text(eid): fields for eid, fields in reply}
        else:
            key.items = list(reply)
    out = {}
    for name, text, kind in listed:
        if text in got:
            out[text] = got[text]
        else:
            out[text] = _read(client, name, text, types(client, [name])[0] if text in changed else kind)
    return out


def _size(pipe: Any, name: bytes, kind: str) -> None:
    if kind == "stream":
        pipe.xinfo_stream(name)
    else:
        getattr(pipe, SIZE[kind])(name)


def _length(reply: Any) -> int:
    return int(reply["length"]) if isinstance(reply, dict) else int(reply)


def _whole(pipe: Any, name: bytes, kind: str) -> None:
    if kind == "list":
        pipe.lrange(name, 0, -1)
    elif kind == "set":
        pipe.smembers(name)
    elif kind == "zset":
        pipe.zrange(name, 0, -1)
    elif kind == "hash":
        pipe.hgetall(name)
    elif kind == "string":
        pipe.get(name)
    else:
        pipe.xrange(name, "-", "+")


def pieces(client: redis.Redis, patterns: Sequence[str], chunk: int = CHUNK) -> Iterator[StoredKey]:
    """The same reading as `take`, one key at a time, and a list, set, sorted set or hash `chunk`
    entries at a time: for a reading that only counts (the depth chart), whose memory must not grow
    with the backlog (a million waiting jobs). A stream comes whole: its groups and entries belong
    together."""
    for name, text, kind in listing(client, patterns):
        yield from key_pieces(client, name, text, kind, chunk)


def key_pieces(client: redis.Redis, name: bytes, text: str, kind: str, chunk: int = CHUNK) -> Iterator[StoredKey]:
    """One key read as `pieces` reads it: a list, set, sorted set or hash `chunk` entries at a time."""
    if kind == "list":
        for start in range(0, client.llen(name), chunk):
            yield StoredKey(text, kind, items=client.lrange(name, start, start + chunk - 1))
    elif kind in ("set", "zset", "hash"):
        scan = {"set": client.sscan, "zset": client.zscan, "hash": client.hscan}[kind]
        cursor: int | None = None
        while cursor != 0:
            cursor, got = scan(name, cursor or 0, count=chunk)
            if kind == "hash":
                yield StoredKey(text, kind, fields=got)
            else:
                yield StoredKey(text, kind, items=[m for m, _ in got] if kind == "zset" else list(got))
    else:
        yield _read(client, name, text, kind)


def types(client: redis.Redis, names: Sequence[bytes]) -> list[str]:
    """Each key's type, in one pipeline ("none": gone since it was listed)."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    return [t.decode() if isinstance(t, bytes) else str(t) for t in pipe.execute()] if names else []


def stream_counted(client: redis.Redis, name: bytes, text: str) -> tuple[StoredKey, int] | None:
    """A stream read for counting only (the depth chart): its groups and their pending entries, and how
    many entries wait undelivered, the slowest group's lag (every entry with no group), without reading
    them: a backlog of 100,000 entries costs a few commands, not seconds of reply parsing. None where
    the server cannot tell a lag (after a deletion, or before Redis 7): read it whole then."""
    key = StoredKey(text, "stream")
    groups = client.xinfo_groups(name)
    if not groups:
        return key, int(client.xlen(name))
    lags = [g.get("lag") for g in groups]
    if any(lag is None for lag in lags):
        return None
    _read_stream(client, name, key, undelivered=False)
    return key, max(int(lag) for lag in lags)


def listing(client: redis.Redis, patterns: Sequence[str]) -> list[tuple[bytes, str, str]]:
    """(name, its text, its type) of every key matching `patterns`, sorted by name."""
    names: list[bytes] = []
    seen: set[bytes] = set()
    for pattern in patterns:
        for name in client.scan_iter(match=pattern, count=1000):
            if name not in seen:
                seen.add(name)
                names.append(name)
    names.sort()  # SCAN's order is arbitrary; a reading should not be
    return [(name, name.decode(errors="replace"), kind) for name, kind in zip(names, types(client, names), strict=True)]


def _read(r: redis.Redis, name: bytes, text: str, kind: str) -> StoredKey:
    key = StoredKey(text, kind)
    if kind == "list":
        n = r.llen(name)
        for start in range(0, n, CHUNK):
            key.items.extend(r.lrange(name, start, start + CHUNK - 1))
    elif kind == "set":
        key.items = list(r.sscan_iter(name, count=CHUNK))
    elif kind == "zset":
        key.items = [m for m, _ in r.zscan_iter(name, count=CHUNK)]
    elif kind == "hash":
        key.fields = dict(r.hscan_iter(name, count=CHUNK))
    elif kind == "string":
        value = r.get(name)
        key.items = [] if value is None else [value]
    elif kind == "stream":
        try:
            _read_stream(r, name, key)
        except redis.ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            return StoredKey(text, "none")  # gone while we looked (deleted since it was listed: arq's job ended)
    return key


def _read_stream(r: redis.Redis, name: bytes, key: StoredKey, undelivered: bool = True) -> None:
    """The groups, their pending entries, and the entries that can still hold a job: with no group
    every entry; with groups, those after the oldest last-delivered id and those pending. Acknowledged
    history (a stream keeps it until trimmed) holds no job, and reading it would cost the most.
    `undelivered` False: the entries after the last-delivered ids are left unread (stream_counted)."""
    info = r.xinfo_stream(name)
    first = info.get("first-entry")
    key.first = _text(first[0]) if first else None
    key.last_generated, key.length = _text(info["last-generated-id"]), int(info["length"])
    for info in r.xinfo_groups(name):
        gname = _text(info["name"])
        group = StreamGroup(gname, _text(info["last-delivered-id"]))
        after = "-"
        while True:
            pel = r.xpending_range(name, gname, min=after, max="+", count=CHUNK)
            for p in pel:
                group.pending[_text(p["message_id"])] = _text(p["consumer"])
            if len(pel) < CHUNK:
                break
            after = "(" + _text(pel[-1]["message_id"])
        for c in r.xinfo_consumers(name, gname):
            inactive = int(c["inactive"]) if "inactive" in c else None  # a server before 7.2 does not say
            seen = Consumer(key.name, gname, _text(c["name"]), int(c["pending"]), int(c["idle"]), inactive)
            group.consumers.append(seen)
        group.consumers.sort(key=lambda c: c.name)
        key.groups.append(group)
    start = "-" if not key.groups else "(" + min(key.groups, key=lambda g: entry_id(g.last_delivered)).last_delivered
    while undelivered:
        chunk = r.xrange(name, start, "+", count=CHUNK)
        for eid, fields in chunk:
            key.entries[_text(eid)] = fields
        if len(chunk) < CHUNK:
            break
        start = "(" + _text(chunk[-1][0])
    wanted = sorted({eid for g in key.groups for eid in g.pending if eid not in key.entries}, key=entry_id)
    for i in range(0, len(wanted), CHUNK):
        pipe = r.pipeline(transaction=False)
        for eid in wanted[i : i + CHUNK]:
            pipe.xrange(name, eid, eid)
        for found in pipe.execute():
            for eid, fields in found:  # empty when the entry was deleted or trimmed
                key.entries[_text(eid)] = fields


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def raw_client(url: str) -> redis.Redis:
    """The inspector's own connection: bytes in, bytes out."""
    return redis.Redis.from_url(url, decode_responses=False)
