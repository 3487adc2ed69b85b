"""The inspector reads a real server itself: every key type, and a stream by what its group still owes."""

from __future__ import annotations

import json

import pytest
import redis

from crashbench import jobids
from crashbench.designs.reliable import ReliableQueue
from crashbench.designs.stream import StreamQueue
from crashbench.evidence import depth, inspector
from crashbench.evidence.search import Needle
from crashbench.model.queue import DesignSettings, Job


def test_every_key_type_is_read_and_only_the_run_s_keys(client: redis.Redis, valkey_url: str) -> None:
    p = "insp:1:"
    client.rpush(p + "list", "a", "b")
    client.sadd(p + "set", "c")
    client.zadd(p + "zset", {"d": 1.0})
    client.hset(p + "hash", mapping={"f": "e"})
    client.set(p + "string", "g")
    client.set("insp:10:list", "not ours")
    snap = inspector.take(inspector.raw_client(valkey_url), [p + "*"])
    assert {k: v.type for k, v in snap.keys.items()} == {
        p + "list": "list", p + "set": "set", p + "zset": "zset", p + "hash": "hash", p + "string": "string",
    }  # fmt: skip
    assert snap.keys[p + "list"].items == [b"a", b"b"] and snap.keys[p + "hash"].fields == {b"f": b"e"}
    assert snap.keys[p + "zset"].items == [b"d"] and snap.keys[p + "string"].items == [b"g"]


def test_a_stream_is_read_by_what_its_group_still_owes(client: redis.Redis, valkey_url: str) -> None:
    key = "insp:2:stream"
    client.xgroup_create(key, "g", id="0", mkstream=True)
    ids = [client.xadd(key, {"id": f"j{i}"}) for i in range(6)]
    client.xreadgroup("g", "w1", {key: ">"}, count=4)  # j0..j3 delivered to w1
    client.xack(key, "g", ids[0])  # j0 done: history
    client.xdel(key, ids[1])  # j1 pending, its entry deleted (trimmed)
    snap = inspector.take(inspector.raw_client(valkey_url), [key])
    places = [(where, eid, fields) for where, eid, fields in snap.keys[key].stream_places()]
    assert [(w, f[b"id"] if f else None) for w, _, f in places] == [
        ("", b"j4"), ("", b"j5"), ("pel:w1", None), ("pel:w1", b"j2"), ("pel:w1", b"j3"),
    ]  # fmt: skip
    assert ids[0] not in snap.keys[key].entries  # acknowledged history is not even read


def test_a_design_locates_its_jobs_by_its_own_key_roles(client: redis.Redis, valkey_url: str) -> None:
    q = ReliableQueue(client, "insp:3:", DesignSettings())
    job = json.dumps({"id": "000001", "payload": "", "attempts": 0})
    client.lpush("insp:3:pending", job)
    client.lpush("insp:3:processing:w1", json.dumps({"id": "000002", "payload": "", "attempts": 0}))
    client.zadd("insp:3:delayed", {json.dumps({"id": "000003", "payload": "", "attempts": 1}): 5.0})
    client.lpush("insp:3:dead", json.dumps({"id": "000004", "payload": "", "attempts": 3}))
    client.sadd("insp:3:requeued", "000009")  # bookkeeping: ids, not jobs
    client.hset("insp:3:heartbeats", "w1", "1.0")
    client.lpush("insp:3:parked", job)  # a key the design never declared: the job is found there too
    located = q.locate(inspector.take(inspector.raw_client(valkey_url), q.key_patterns()))
    assert located.held == {"000001": ["parked", "pending"], "000002": ["processing:w1"], "000003": ["delayed"]}
    assert located.delayed == {"000003"} and located.dead == {"000004": ["dead"]}


@pytest.mark.parametrize("by_token", [False, True])
def test_the_depth_read_in_pieces_counts_what_the_whole_reading_does(
    client: redis.Redis, valkey_url: str, monkeypatch: pytest.MonkeyPatch, by_token: bool
) -> None:
    """The depth chart's reading, a key at a time and PIECE entries at a time (so a million waiting jobs
    cost a byte each), against the whole reading it stands for: the same pending, delayed and dead;
    counted through `locate`, and (a run's ids carrying its token) by the harness's search."""
    monkeypatch.setattr(depth.Reader, "PIECE", 7)  # every key below spans several pieces
    prefix = f"insp:4{'t' if by_token else ''}:"
    q = ReliableQueue(client, prefix, DesignSettings())
    token = jobids.token() if by_token else ""
    if by_token:
        jobids.register(token)
    needle = Needle(token) if by_token else None

    def entry(i: int, attempts: int = 0) -> str:
        return json.dumps({"id": f"{token}{i:06d}", "payload": "", "attempts": attempts})

    client.rpush(prefix + "pending", *[entry(i) for i in range(40)])
    client.rpush(prefix + "processing:w1", entry(40), entry(41))
    client.zadd(prefix + "delayed", {entry(i, 1): float(i) for i in range(50, 65)})
    client.rpush(prefix + "dead", *[entry(i, 3) for i in range(70, 80)])
    client.rpush(prefix + "parked", entry(3))  # a job in two places counts once
    client.sadd(prefix + "requeued", f"{token}000045")  # bookkeeping: no job
    raw = inspector.raw_client(valkey_url)
    inside = {"000040"}
    whole = q.locate(inspector.take(raw, q.key_patterns()))
    expected = (
        sum(1 for j in whole.held if j not in whole.delayed and j not in inside), len(whole.delayed), len(whole.dead)
    )  # fmt: skip
    found = depth.Reader(q, raw, inside, needle).step()
    assert found is not None
    assert (found.pending, found.delayed, found.dead) == expected == (41, 15, 10)
    # A list comes 7 entries at a time (ZSCAN's COUNT is a hint: a small sorted set comes whole).
    assert max(len(p.items) for p in inspector.pieces(raw, q.key_patterns(), 7) if p.type == "list") == 7


def test_a_depth_reading_goes_on_over_ticks_and_is_dated_when_it_began(
    client: redis.Redis, valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big backlog is read a slice per tick, so that the runner's loop (which restarts killed workers)
    is never held up for the seconds a reading of millions takes; the sample is the complete reading."""
    monkeypatch.setattr(depth.Reader, "PIECE", 5)
    q = ReliableQueue(client, "insp:big:", DesignSettings())
    client.rpush("insp:big:pending", *[json.dumps({"id": f"{i:06d}", "payload": "", "attempts": 0}) for i in range(50)])
    raw = inspector.raw_client(valkey_url)
    sampler = depth.Sampler()
    sampler.SLICE = 0.0  # one piece per step
    t = 100.0
    while not sampler.samples:
        assert sampler.due(t)
        sampler.step(t, 100.0, lambda: depth.Reader(q, raw, {"000001"}))
        t += 1.0
    # 10 pieces of 5, one a tick, then the tick that finds none left; dated at its first tick.
    assert t == 111.0 and [(d.t, d.pending, d.inflight) for d in sampler.samples] == [(0.0, 49, 1)]
    # The next reading waits EVERY at least (longer when this one took long: COST times its cost).
    assert sampler.next >= 110.25 and not sampler.due(110.2)
    sampler.step(300.0, 100.0, lambda: depth.Reader(q, raw, set()), whole=True)  # at once, a fresh one
    assert [(d.t, d.pending) for d in sampler.samples[1:]] == [(200.0, 50)]


def test_the_depth_of_a_large_backlog_is_counted_not_read(
    client: redis.Redis, valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the run's token, a key of more than LARGE entries is counted by its length and a stream's
    undelivered entries by its group's lag, neither read; its pending entries are still searched, so
    a job inside a handler is not waiting. After an XDEL the server cannot tell a lag: read whole."""
    monkeypatch.setattr(depth.Reader, "LARGE", 10)
    token = jobids.token()
    jobids.register(token)
    needle = Needle(token)
    raw = inspector.raw_client(valkey_url)
    q = ReliableQueue(client, "insp:large:", DesignSettings())
    client.rpush("insp:large:pending", *[json.dumps({"id": f"{token}{i:06d}", "payload": ""}) for i in range(30)])
    client.rpush("insp:large:dead", *[json.dumps({"id": f"{token}{i:06d}", "payload": ""}) for i in range(30, 33)])
    retries = {json.dumps({"id": f"{token}{i:06d}", "payload": "", "attempts": 1}): float(i) for i in range(40, 52)}
    client.zadd("insp:large:delayed", retries)  # 12 retries waiting for their due time: delayed, not pending
    read: list[str] = []
    monkeypatch.setattr(inspector, "key_pieces", lambda r, name, text, *a: read.append(text) or iter(()))
    found = depth.Reader(q, raw, set(), needle).step()
    assert found is not None and (found.pending, found.delayed, found.dead) == (30, 12, 0)  # dead (3): read, here not
    assert read == ["insp:large:dead"]  # ... the 30 waiting were counted, the small list was read
    monkeypatch.undo()

    s = StreamQueue(client, "insp:bigs:", DesignSettings())
    s.setup()
    s.enqueue([Job(f"{token}{i:06d}") for i in range(25)])
    stream = "insp:bigs:stream"
    group = client.xinfo_groups(stream)[0]["name"]
    client.xreadgroup(group, "w1", {stream: ">"}, count=5)  # 5 delivered, pending; 20 undelivered
    inside = {"000001", "000002"}  # two of the five inside a handler
    found = depth.Reader(s, raw, inside, needle).step()
    assert found is not None and found.pending == 20 + 3
    assert inspector.stream_counted(raw, stream.encode(), stream) is not None
    last = client.xrevrange(stream, "+", "-", count=1)[0][0]
    client.xdel(stream, last)  # an undelivered entry deleted: the server can no longer tell the lag
    assert inspector.stream_counted(raw, stream.encode(), stream) is None
    found = depth.Reader(s, raw, inside, needle).step()  # read whole, as before
    assert found is not None and found.pending == 19 + 3


def test_take_reads_in_pipelines_what_each_key_read_on_its_own_holds(
    client: redis.Redis, valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library keeps a hash (and a result stream) per job: `take` reads small keys in pipelines, not a
    round trip each, and finds what reading each key on its own finds. A big key, a stream with a group
    and a key whose type changed since it was listed are read on their own."""
    monkeypatch.setattr(inspector, "CHUNK", 5)
    p = "insp:pipe:"
    for i in range(40):
        client.hset(f"{p}job:{i}", mapping={"data": f"x{i}", "status": "queued"})
        client.xadd(f"{p}results:{i}", {"r": str(i)})
    client.rpush(p + "big", *range(12))  # more than CHUNK: read in chunks
    client.rpush(p + "small", "a", "b")
    client.sadd(p + "set", "c")
    client.zadd(p + "zset", {"d": 1.0, "e": 2.0})
    client.set(p + "string", "g")
    client.xgroup_create(p + "grouped", "g", id="0", mkstream=True)
    client.xadd(p + "grouped", {"id": "j1"})
    client.rpush(p + "retyped", "h")
    raw = inspector.raw_client(valkey_url)
    real_listing, real_read = inspector.listing, inspector._read
    alone: list[str] = []

    def listing(client, patterns):  # type: ignore[no-untyped-def]
        # As if p:retyped were a hash when it was listed, and became a list before it was read.
        return [(n, t, "hash" if t.endswith("retyped") else k) for n, t, k in real_listing(client, patterns)]

    def read(r, name, text, kind):  # type: ignore[no-untyped-def]
        alone.append(text)
        return real_read(r, name, text, kind)

    monkeypatch.setattr(inspector, "listing", listing)
    monkeypatch.setattr(inspector, "_read", read)
    snap = inspector.take(raw, [p + "*"])
    assert sorted(alone) == [p + "big", p + "grouped", p + "retyped"]
    expected = {t: real_read(raw, n, t, k) for n, t, k in real_listing(raw, [p + "*"])}
    assert list(snap.keys) == list(expected)
    for text, key in expected.items():
        got = snap.keys[text]
        assert (got.type, sorted(got.items), got.fields, got.entries) == (
            key.type, sorted(key.items), key.fields, key.entries,
        ), text  # fmt: skip
        assert (got.first, got.last_generated, got.length, len(got.groups)) == (
            key.first, key.last_generated, key.length, len(key.groups),
        ), text  # fmt: skip
    assert snap.keys[p + "big"].items == [str(i).encode() for i in range(12)]
    assert snap.keys[p + "retyped"].type == "list" and snap.keys[p + "retyped"].items == [b"h"]


class _Whole(ReliableQueue):
    """A design with a `locate` of its own (as a library's): its depth reading is taken whole."""

    gate = None  # a threading.Event the reading waits on
    error: Exception | None = None

    def locate(self, snapshot):  # type: ignore[no-untyped-def]
        assert self.gate is not None and self.gate.wait(30)
        if self.error is not None:
            raise self.error
        return super().locate(snapshot)


def test_a_whole_depth_reading_runs_on_its_own_thread_and_its_error_reaches_the_runner(
    client: redis.Redis, valkey_url: str
) -> None:
    """A library's reading (its locate joins keys) cannot be sliced: it runs on a thread of its own, so a
    slow one never holds the runner's loop, which makes the faults and restarts the workers."""
    import threading

    q = _Whole(client, "insp:whole:", DesignSettings())
    client.rpush("insp:whole:pending", *[json.dumps({"id": f"{i:06d}", "payload": ""}) for i in range(3)])
    raw = inspector.raw_client(valkey_url)
    q.gate = threading.Event()
    reader = depth.Reader(q, raw, set())
    assert reader.step(0.0) is None and reader.step(0.0) is None  # the reading waits on the gate
    q.gate.set()
    found = reader.step()  # inf: wait for it
    assert found is not None and found.pending == 3
    q.gate, q.error = threading.Event(), redis.ConnectionError("server down")
    reader = depth.Reader(q, raw, set())
    assert reader.step(0.0) is None
    q.gate.set()
    with pytest.raises(redis.ConnectionError, match="server down"):
        reader.step()


def test_a_stream_deleted_between_its_listing_and_its_reading_is_read_empty(client: redis.Redis) -> None:
    """A library's stream can go between the scan that lists it and the reading (arq's ended job, in a
    sharded libraries run): read as gone ("none"), not the end of the run. Read directly,
    a key that no longer exists answers `no such key`."""
    with pytest.raises(redis.ResponseError, match="no such key"):
        client.xinfo_stream("gone-stream")
    key = inspector._read(client, b"gone-stream", "gone-stream", "stream")
    assert (key.name, key.type, key.groups, key.length) == ("gone-stream", "none", [], 0)
