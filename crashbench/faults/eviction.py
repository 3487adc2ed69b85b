"""The `eviction` family: a memory limit on the server for a while, and what its eviction policy takes
(rq/rq#1280, and the same in Sidekiq and BullMQ: `maxmemory` eviction silently drops queued jobs).

At `at` the harness sets `maxmemory` (bytes, "64mb", or "used+2mb": the server's used_memory then, plus
a margin, so the limit bites whatever the design's footprint) and `maxmemory-policy` on the run's own
server (a broker fault: one per run, on a server crashbench started), and something fills it: the
`neighbour` (the harness writes a neighbour app's cache keys, outside the run's namespace, with
`neighbour_ttl` or none, a batch a tick, so the server stays at its limit), or the jobs' own `payloads`
(workload.payload_bytes; the harness writes nothing). `limit_s` later the limit is lifted (maxmemory 0).

The evidence is the server's own: it publishes every key it evicts (`notify-keyspace-events Ee`:
`__keyevent@<db>__:evicted`), which the harness reads on its tick, never blocking, and each of the
run's keys it names is recorded with the jobs the harness's own readings (crashbench.evidence.inspector,
taken every tick while the limit holds, right after the producer's enqueue) found in it at the last two
readings before it went; INFO stats' evicted_keys and INFO errorstats' OOM count, before and after,
check the notifications and count the commands the server refused. The checker counts the evictions
(evicted_keys, evicted_neighbour), the lost jobs an evicted key held (lost_to_eviction: they stay in
`lost`; this says why) and the refused commands (oom_refused). Under `noeviction` writes are refused
instead: the producer's enqueues are indeterminate, workers retry (crashbench.run.worker)."""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any

import redis

from crashbench.control.server import cleanup_keys
from crashbench.evidence import inspector
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.evidence.keyspace import blob
from crashbench.faults.family import Band, Driver, Entry, FaultFamily
from crashbench.model.counts import Problem
from crashbench.model.faults import JOB_SAMPLE, Fault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import FaultEvent, Timeline, rel

POLICIES = (
    "allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random",
    "volatile-ttl", "noeviction",
)  # fmt: skip
FILLS = ("neighbour", "payloads")
NEIGHBOUR = "neighbour:cache:"  # the neighbour app's keys: never a design's pattern
KEYS = ("kind", "at", "maxmemory", "policy", "fill", "ttl", "duration")
_SIZE = re.compile(r"(used\+)?([0-9]+)(b|kb|mb|gb)?", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_size(value: object) -> tuple[bool, int] | None:
    """(relative to used_memory, bytes) of a maxmemory setting; None when it is not one. An absolute
    limit is at least 1 byte (0 is Redis's "no limit")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (False, value) if 0 < value < 2**63 else None
    m = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        return None
    n = int(m.group(2)) * _UNIT[(m.group(3) or "").lower()]
    relative = m.group(1) is not None
    return (relative, n) if (relative or n > 0) and n < 2**63 else None


def fields(entry: Entry) -> dict[str, Any]:
    """An entry's [broker] section: the fault, and what it gives of its time, limit, policy and fill."""
    names = (("at", "fault_at"), ("maxmemory", "maxmemory"), ("policy", "maxmemory_policy"), ("fill", "fill"),
             ("ttl", "neighbour_ttl"), ("duration", "limit_s"))  # fmt: skip
    return {"fault": "eviction", **{field: entry[key] for key, field in names if key in entry}}


def section(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
    b = sc.broker
    return [Fault(start, b.fault_at, "eviction", duration=b.limit_s)] if b.fault == "eviction" else []


def combinations(sc: Scenario) -> list[str]:
    if parse_size(sc.broker.maxmemory) is None:
        return [
            f'broker.maxmemory must be bytes (a whole number > 0), a size ("64mb", "512kb") or used memory '
            f'plus a margin ("used+2mb"), not {sc.broker.maxmemory!r:.60}'
        ]
    return []


class Eviction:
    """The limit imposed at its time, the server kept at it (neighbour fill), its evictions read off the
    server's notifications each tick against the harness's own readings of the run's keys, and the
    limit lifted `duration` later."""

    fine = False  # stepped once a tick, after the producer's enqueue (on_server)
    PER_STEP = 8  # neighbour keys written a tick while the limit holds
    VALUE = b"n" * 4096

    def __init__(self, fault: Fault, run: Any) -> None:
        b = run.sc.broker
        self.fault, self.t0, self.clock = fault, run.t0, run.clock
        self.policy, self.fill, self.ttl = b.maxmemory_policy, b.fill, b.neighbour_ttl
        self.size = parse_size(b.maxmemory) or (True, 1024**2)
        self.patterns, self.needle = run.design.key_patterns(), run.needle
        self.url = run.broker.url
        self.client = redis.Redis.from_url(self.url, socket_timeout=10)
        self.db = int(self.client.connection_pool.connection_kwargs.get("db", 0))
        self.sub: Any = None
        self.phase = "waiting"  # limited, lifted
        self.written = self.refused = 0  # the neighbour's writes, and those the server refused (OOM)
        # The last three readings: the jobs in each of the run's keys, and the jobs the producer enqueued
        # since the reading before that it found nowhere (evicted before the harness could look).
        self.readings: deque[tuple[dict[str, set[str]], set[str]]] = deque(maxlen=3)
        self.producer, self.chunks = run.producer, 0
        self.events: list[FaultEvent] = []
        self.before: dict[str, Any] = {}

    @property
    def down(self) -> bool:
        """While the limit holds the runner neither recovers nor samples the depth (writes may be refused)."""
        return self.phase == "limited"

    @property
    def done(self) -> bool:
        return self.phase == "lifted"

    def step(self, now: float) -> None:
        if self.phase == "waiting" and now >= self.t0 + self.fault.at:
            self._impose()
        if self.phase != "limited":
            return
        self._read()
        self._evicted()
        if now >= self.t0 + self.fault.at + self.fault.duration:
            self._lift()
        elif self.fill == "neighbour":
            self._write(self.PER_STEP)

    def _counters(self) -> dict[str, int]:
        stats, errors = self.client.info("stats"), self.client.info("errorstats")
        oom = errors.get("errorstat_OOM", {})
        return {"evicted": int(stats["evicted_keys"]), "oom": int(oom.get("count", 0) if isinstance(oom, dict) else 0)}

    def _impose(self) -> None:
        c = self.client
        self.restore = {k: c.config_get(k)[k] for k in ("maxmemory-policy", "notify-keyspace-events")}
        c.config_set("notify-keyspace-events", "Ee")
        self.sub = c.pubsub()
        self.sub.subscribe(f"__keyevent@{self.db}__:evicted")
        self._until("subscribe")  # subscribed before anything can be evicted
        used = int(c.info("memory")["used_memory"])
        relative, n = self.size
        limit = used + n if relative else n
        self.before = self._counters()
        c.config_set("maxmemory-policy", self.policy)
        c.config_set("maxmemory", limit)
        data = {"maxmemory": limit, "policy": self.policy, "fill": self.fill, "used": used}
        self.events.append(FaultEvent("eviction", "limit", rel(self.clock(), self.t0), data))
        self.phase = "limited"
        self._read()
        if self.fill == "neighbour":  # up to the limit at once: until the server evicts or refuses
            for _ in range(limit // (64 * len(self.VALUE)) + 64):
                if self._write(64) or self._counters()["evicted"] > self.before["evicted"]:
                    break

    def _write(self, n: int) -> bool:
        """`n` neighbour keys written; whether the server refused any."""
        pipe = self.client.pipeline(transaction=False)
        for _ in range(n):
            pipe.set(f"{NEIGHBOUR}{self.written}", self.VALUE, ex=int(self.ttl) or None)
            self.written += 1
        refused = sum(isinstance(r, redis.exceptions.OutOfMemoryError) for r in pipe.execute(raise_on_error=False))
        self.refused += refused
        return refused > 0

    def _read(self) -> None:
        """The jobs in each of the run's keys, by the harness's own reading (every key, in full)."""
        snap = inspector.take(self.client, self.patterns)
        now = {name: set(self.needle.ids(name.encode()) + self.needle.ids(blob(k))) for name, k in snap.keys.items()}
        chunks = self.producer.chunks[self.chunks :] if self.producer is not None else []
        self.chunks += len(chunks)
        unseen = {j for _, ids, ok, _, _ in chunks if ok for j in ids} - {j for ids in now.values() for j in ids}
        self.readings.append((now, unseen))

    def _evicted(self, until: str | None = None) -> None:
        """The server's notifications so far: each of the run's keys with the jobs it held at the last
        readings (it went after the first of them, perhaps before the last), and the jobs enqueued that no
        reading found, the neighbour's counted. With `until`, read on until that reply (a PING's:
        every earlier notification is in)."""
        neighbour = 0
        t = rel(self.clock(), self.t0)
        while True:
            m = self.sub.get_message(timeout=1.0 if until else 0.0)
            if m is None and until:
                raise redis.TimeoutError("the server's notifications stopped before the reply to the harness's PING")
            if m is None or m["type"] == until:
                break
            if m["type"] != "message":
                continue
            key = m["data"].decode(errors="replace")
            if key.startswith(NEIGHBOUR):
                neighbour += 1
                continue
            jobs = set(self.needle.ids(m["data"]))
            for held, unseen in self.readings:
                jobs |= held.get(key, set()) | unseen
            self.events.append(FaultEvent("eviction", "evicted", t, {"key": key, "jobs": sorted(jobs)}))
        if neighbour:
            self.events.append(FaultEvent("eviction", "neighbour_evicted", t, {"n": neighbour}))

    def _until(self, reply: str) -> None:
        while (m := self.sub.get_message(timeout=1.0)) is None or m["type"] != reply:
            if m is None:
                raise redis.TimeoutError(f"no {reply} reply from the server's notifications")

    def _lift(self) -> None:
        c = self.client
        c.config_set("maxmemory", 0)
        c.config_set("maxmemory-policy", self.restore["maxmemory-policy"])
        self.sub.ping()
        self._evicted(until="pong")  # every eviction before the lift was published before this reply
        after = self._counters()
        c.config_set("notify-keyspace-events", self.restore["notify-keyspace-events"])
        self.sub.close()
        data = {
            "evicted": after["evicted"] - self.before["evicted"],  # INFO stats: every key evicted meanwhile
            "oom": after["oom"] - self.before["oom"] - self.refused,  # INFO errorstats: the run's refused commands
            "written": self.written, "refused": self.refused,
        }  # fmt: skip
        self.events.append(FaultEvent("eviction", "lifted", rel(self.clock(), self.t0), data))
        c.close()
        cleanup_keys(self.url, NEIGHBOUR)  # the neighbour gone again: the final reading searches the whole server
        self.phase = "lifted"


def driver(run: Any) -> Driver | None:
    fault = next((f for f in run.planned if f.kind == "eviction"), None)
    if fault is None or run.broker is None:
        return None
    return Eviction(fault, run)


def history(d: Driver) -> dict[str, Any]:
    return {"fault_events": d.events}  # type: ignore[attr-defined]


@checker("eviction")
def _eviction(h: History, before: Sections) -> Section:
    """What the server evicted while the limit held, from its own notifications; the lost jobs an evicted
    key of the run's held; the commands it refused. Its INFO evicted_keys must agree with the notifications."""
    events = [e for e in h.timeline.fault_events if e.family == "eviction"]
    if not events:
        return Section("eviction")
    lost = before.fact("outcomes", "classes")["lost"]
    evicted = [e for e in events if e.what == "evicted"]
    held = {j for e in evicted for j in e.data["jobs"]}
    neighbour = sum(e.data["n"] for e in events if e.what == "neighbour_evicted")
    lifted = next((e for e in events if e.what == "lifted"), None)
    counts = {
        "evicted_keys": len(evicted), "evicted_neighbour": neighbour, "lost_to_eviction": len(lost & held),
        "oom_refused": lifted.data["oom"] if lifted else 0,
    }  # fmt: skip
    problems = []
    if lifted is not None and lifted.data["evicted"] != len(evicted) + neighbour:
        problems.append(Problem(
            "eviction", f"the server's INFO evicted_keys grew by {lifted.data['evicted']}, its notifications "
            f"named {len(evicted) + neighbour} keys",
        ))  # fmt: skip
    jobs = {"lost_to_eviction": sorted(lost & held)[:JOB_SAMPLE]}
    return Section("eviction", counts=counts, problems=problems, jobs=jobs)


def bands(tl: Timeline) -> list[Band]:
    events = [e for e in tl.fault_events if e.family == "eviction"]
    limit = next((e for e in events if e.what == "limit"), None)
    if limit is None:
        return []
    lifted = next((e.t for e in events if e.what == "lifted"), None)
    run_keys = sum(1 for e in events if e.what == "evicted")
    what = f"maxmemory {limit.data['maxmemory']:,} B, {limit.data['policy']}"
    tip = f"{what} at {limit.t:.3f} s ({run_keys} of the run's keys evicted)"
    return [Band(limit.t, lifted, "eviction", what, tip)]


FAMILY = FaultFamily(
    name="eviction",
    summary="a maxmemory limit and an eviction policy on the embedded server, filled by a neighbour or payloads",
    kinds=("eviction",),
    keys=KEYS,
    combinations=combinations,
    section=section,
    fields=fields,
    on_server=True,
    driver=driver,
    history=history,
    checkers=(_eviction,),
    bands=bands,
    css=".band.eviction rect{fill:#e8c3f0}",
    rows=(
        ("keys evicted", "evicted_keys", False),
        ("  the neighbour's", "evicted_neighbour", False),
        ("lost to eviction", "lost_to_eviction", True),
        ("writes refused (OOM)", "oom_refused", False),
    ),
)
