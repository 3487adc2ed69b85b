"""An independent reading of one kept crash run, for the soak test (tests/test_soak.py): the counts
computed again from the raw evidence, by code that shares nothing with crashbench's.

Why a second reader: crashbench's counts come from its ledger parser, its inspector and the design's
`job_of`; a bug shared by those (or a design able to steer them: issue 25) would be invisible to any
test that reuses them. So this module imports nothing from crashbench. It parses the ledger files
itself (the format is the one documented in crashbench/model/ledger.py, spelled out again here),
and reads Redis itself, every key of the server, with its own redis-py client, finding job ids in
values with its own regular expressions. Only the built-in designs' conventions are assumed, and they
are assumed here in the open rather than asked of the design:

- a job's *body* is a JSON object with an "id" (lists, sorted sets, strings, hash values) or a stream
  entry with a field `id`; an id is an optional run token followed by at least six digits, so the ids
  of today ("000042") and ids that carry a run-unique token ("<token>-000042") are both found;
- a stream entry is held while it is undelivered (after its group's last-delivered id) or pending (in
  a group's PEL); a delivered and acknowledged entry stays in the stream but holds nothing;
- a key whose last name component is `dead` is a dead-letter list; the stream designs keep bare ids in
  it, so there a whole value that is an id counts too. Anywhere else a bare id is a mark (requeued,
  poisoned), not a job.

Times: the ledger's are the harness's monotonic clock; a result's kill times are seconds since its t0.
The offset comes from the one event both record, a worker's READY (ledger `R` vs the timeline's `ready`).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

# An id: an optional token (no quotes, no spaces), then at least six digits, at the end.
_ID = r"[^\s\"\\]*?\d{6,}"
JSON_ID = re.compile(rf'"id"\s*:\s*"({_ID})"')
BARE_ID = re.compile(rf"^({_ID})$")
NUMBER = re.compile(r"(\d{6,})$")
FATAL = {"SIGKILL", "SIGQUIT", "SIGABRT", "SIGSEGV", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"}  # default action: die


@dataclass
class Run:
    """One handler execution as the ledger shows it (monotonic seconds)."""

    job: str
    worker: str
    pid: int
    start: float
    end: float | None = None  # None: never ended (interrupted)
    failed: bool = False


@dataclass
class LedgerReading:
    runs: list[Run] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)  # worker -> its R time
    empty_acks: int = 0
    anomalies: list[str] = field(default_factory=list)  # lines that do not fit (none expected)


def read_ledgers(directory: Path) -> LedgerReading:
    """Every `<worker>.ledger` file: S opens an execution in its context (pid, thread), E or F closes it,
    A and N acknowledge (N: the ack found nothing), R is the worker's READY."""
    out = LedgerReading()
    for path in sorted(directory.glob("*.ledger")):
        worker = path.stem
        open_: dict[tuple[int, int], Run] = {}
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ")
            if parts[0] == "R" and len(parts) == 2:
                out.ready[worker] = float(parts[1])
                continue
            if len(parts) != 5 or parts[0] not in "SEFAN":
                out.anomalies.append(f"{worker}: {line!r}")
                continue
            kind, job, t, pid, xid = parts
            ctx = (int(pid), int(xid))
            if kind == "S":
                run = Run(job, worker, int(pid), float(t))
                out.runs.append(run)
                if ctx in open_:
                    out.anomalies.append(f"{worker}: {line!r} over an open start")
                open_[ctx] = run
            elif kind in "EF":
                run = open_.pop(ctx, None)
                if run is None or run.job != job:
                    out.anomalies.append(f"{worker}: {line!r} closes nothing")
                    continue
                run.end, run.failed = float(t), kind == "F"
            elif kind == "N":
                out.empty_acks += 1
    return out


@dataclass
class RedisReading:
    held: dict[str, str] = field(default_factory=dict)  # id -> the key (and place) its body was found in
    dead: set[str] = field(default_factory=set)
    consumers: int = 0  # consumers of every group of every stream
    keys: list[str] = field(default_factory=list)


def _ids_in(value: str) -> list[str]:
    return JSON_ID.findall(value)


def read_redis(client: redis.Redis) -> RedisReading:
    """Every key of the server (the test's own, holding this run's keys only), read by type."""
    out = RedisReading()
    for key in sorted(client.scan_iter(count=1000)):
        out.keys.append(key)
        kind = client.type(key)
        dead = key.rsplit(":", 1)[-1] == "dead"
        values: list[str] = []
        if kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "set":
            values = sorted(client.smembers(key))
        elif kind == "zset":
            values = client.zrange(key, 0, -1)
        elif kind == "hash":
            values = [v for pair in client.hgetall(key).items() for v in pair]
        elif kind == "string":
            values = [client.get(key) or ""]
        elif kind == "stream":
            _read_stream(client, key, out)
            continue
        for v in values:
            found = _ids_in(v) or (BARE_ID.findall(v) if dead else [])
            for job in found:
                if dead:
                    out.dead.add(job)
                else:
                    out.held.setdefault(job, key)
    return out


def _read_stream(client: redis.Redis, key: str, out: RedisReading) -> None:
    entries = client.xrange(key, "-", "+")
    groups = client.xinfo_groups(key)
    pending: set[str] = set()
    last = "0-0" if groups else None
    for g in groups:
        out.consumers += len(client.xinfo_consumers(key, g["name"]))
        pending |= {p["message_id"] for p in client.xpending_range(key, g["name"], "-", "+", 1_000_000)}
        # Held until every group has it delivered: the lowest last-delivered id of them all.
        gid = g["last-delivered-id"]
        last = gid if last == "0-0" or _eid(gid) < _eid(last) else last
    for eid, fields in entries:
        job = fields.get("id")
        if job is None or not BARE_ID.match(job):
            continue
        if key.rsplit(":", 1)[-1] == "dead":
            out.dead.add(job)
        elif last is None or eid in pending or _eid(eid) > _eid(last):
            out.held.setdefault(job, f"{key} {'pel' if eid in pending else 'undelivered'}")


def _eid(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def number(job: str) -> int:
    m = NUMBER.search(job)
    return int(m.group(1)) if m else -1


def _overlapping(runs: list[Run]) -> bool:
    runs = sorted(runs, key=lambda r: r.start)
    latest = runs[0].end or 0.0
    for r in runs[1:]:
        if r.start < latest:
            return True
        latest = max(latest, r.end or 0.0)
    return False


@dataclass
class KillReading:
    """One fault, read from the ledger: was the victim inside a handler, and which jobs."""

    index: int
    signal: str
    mid_job: bool
    jobs: list[str]
    unrecovered: int
    # The victim's executions, by job: (start, end) in ms from the fault's time (end None: never ended).
    around: dict[str, tuple[float, float | None]]


def read_kill(kill: dict[str, Any], ledger: LedgerReading, t0: float, pause: float = 0.0) -> KillReading:
    """A fatal signal: the victim died inside the executions its process left open (the ledger, read
    after the process is gone, is final). A pause: inside the executions whose handler's own start and
    end enclose the middle of the pause (`pause` s from the fault's time), when the worker is stopped
    for sure whatever the delay between the harness's clock and the signal; a handler that ended before
    the pause is not inside, even if its record was written after it (issue 25, item 4). A graceful
    stop: inside the executions whose handler's times enclose the fault's time itself (the worker goes
    on, so nothing later marks the moment)."""
    at = t0 + kill["at"]
    mine = [r for r in ledger.runs if r.pid == kill["pid"]]
    if kill["signal"] in FATAL:
        inside = [r for r in mine if r.end is None]
    else:
        probe = at + pause / 2 if kill["signal"] == "SIGSTOP" else at
        inside = [r for r in mine if r.start <= probe and (r.end is None or r.end > probe)]
    unrecovered = 0
    for r in inside:
        again = [x for x in ledger.runs if x.job == r.job and x.start > at]
        finished_where_it_was = r.end is not None and not r.failed
        if not again and not finished_where_it_was:
            unrecovered += 1
    around = {r.job: (_ms(r.start - at), None if r.end is None else _ms(r.end - at)) for r in mine}
    return KillReading(kill["index"], kill["signal"], bool(inside), [r.job for r in inside], unrecovered, around)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def t0_of(ledger: LedgerReading, timeline: Path) -> float:
    """The result's t0 on the ledger's clock, from the workers' READY in both."""
    ready: dict[str, float] = {}
    with gzip.open(timeline, "rt") as f:
        for line in f:
            event = json.loads(line)
            if event.get("e") == "ready":
                ready[event["worker"]] = event["t"]
    offsets = {round(ledger.ready[w] - t, 6) for w, t in ready.items() if w in ledger.ready}
    assert offsets, "no worker's READY in both the ledger and the timeline"
    return min(offsets)


@dataclass
class Reading:
    counts: dict[str, int]
    kills: list[KillReading]
    held_at: dict[str, str]  # id -> where, for the stranded ones
    anomalies: list[str]


def read_run(
    workdir: Path, client: redis.Redis, enqueued: int, kills: list[dict[str, Any]], timeline: Path, pause: float = 0.0
) -> Reading:
    """Every count of a run of `enqueued` jobs (numbered 0..enqueued-1) from its ledger and from Redis;
    `pause`: how long a SIGSTOP's pause lasted."""
    ledger = read_ledgers(workdir / "ledger")
    store = read_redis(client)
    anomalies = list(ledger.anomalies)
    spelled: dict[int, set[str]] = defaultdict(set)
    for job in [r.job for r in ledger.runs] + list(store.held) + list(store.dead):
        spelled[number(job)].add(job)
    anomalies += [f"job {n} spelled {sorted(s)}" for n, s in spelled.items() if len(s) > 1]
    ours = {job for job in (r.job for r in ledger.runs) if 0 <= number(job) < enqueued}
    completed = Counter(r.job for r in ledger.runs if r.end is not None and not r.failed)
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in ledger.runs:
        by_job[r.job].append(r)
    done = {j for j in completed if 0 <= number(j) < enqueued}
    dead = {j for j in store.dead if 0 <= number(j) < enqueued} - done
    held = {j for j in store.held if 0 <= number(j) < enqueued} - done - dead
    raised_last = {j for j in ours - done - dead - held if max(by_job[j], key=lambda r: r.start).failed}
    twice = [j for j in done if completed[j] > 1]
    overlapping = sum(1 for j in twice if _overlapping([r for r in by_job[j] if r.end is not None and not r.failed]))
    failed_first: dict[str, float] = {}
    for r in ledger.runs:
        if r.failed:
            failed_first[r.job] = min(failed_first.get(r.job, r.start), r.start)
    retried = {j for j, t in failed_first.items() if any(r.start > t for r in by_job[j]) and 0 <= number(j) < enqueued}
    t0 = t0_of(ledger, timeline) if kills else 0.0
    kill_readings = [read_kill(k, ledger, t0, pause) for k in kills]
    counts = {
        "enqueued": enqueued,
        "done": len(done),
        "dead_lettered": len(dead),
        "stranded": len(held),
        "failed": 0,  # no design here drops a failed job silently in these runs: no job's handler raises
        "lost": enqueued - len(done) - len(dead) - len(held),
        "unconfirmed": 0,  # every enqueue was acknowledged: no broker fault
        "duplicated": len(twice),
        "duplicated_overlapping": overlapping,
        "duplicated_sequential": len(twice) - overlapping,
        "extra_executions": sum(completed[j] - 1 for j in twice),
        "failed_attempts": sum(1 for r in ledger.runs if r.failed),
        "retried": len(retried),
        "dead_lettered_poison": sum(1 for j in dead if any(r.failed for r in by_job[j])),
        "empty_acks": ledger.empty_acks,
        "unexpected": len({r.job for r in ledger.runs if not 0 <= number(r.job) < enqueued}),
        "executions": len(ledger.runs),
        "interrupted": sum(1 for r in ledger.runs if r.end is None),
        "kills": len(kills),
        "kills_mid_job": sum(k.mid_job for k in kill_readings),
        "unrecovered": sum(k.unrecovered for k in kill_readings),
        "consumers": store.consumers,
    }
    if raised_last:
        anomalies.append(f"jobs whose last execution raised: {sorted(raised_last)[:10]}")
    return Reading(counts, kill_readings, {j: store.held[j] for j in held}, anomalies)


def redelivered(workdir: Path, enqueued: int) -> tuple[int, int]:
    """(jobs, starts): the starts of a job after an earlier start of it that did not raise, from the
    ledger alone: what recovery gave back and a worker ran again (issue 25, item 3)."""
    ledger = read_ledgers(workdir / "ledger")
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in ledger.runs:
        if 0 <= number(r.job) < enqueued:
            by_job[r.job].append(r)
    events = jobs = 0
    for runs in by_job.values():
        runs.sort(key=lambda r: r.start)
        again = sum(1 for prev, _ in itertools.pairwise(runs) if not prev.failed)
        events += again
        jobs += again > 0
    return jobs, events
