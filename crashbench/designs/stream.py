"""stream: XADD + consumer group, XACK, recovery by XAUTOCLAIM, dead letters by delivery count.

Keys (all under the run prefix P):
    P stream      the stream; each entry has fields id (job id), payload, attempts (failed attempts
                  before this entry). Entries are kept after XACK (a stream keeps history until
                  trimmed). With stream_maxlen N, every XADD (enqueue and retry) trims it to N entries
                  (MAXLEN N, or MAXLEN ~ N: whole nodes only), by position: unread and pending entries
                  go as well as acknowledged ones. 0: never trimmed
    P delayed     sorted set: JSON job -> harness-clock time its retry is due (a new entry then)
    P dead        list of dead-lettered job ids
    P poisoned    set of job ids dead-lettered because their handler kept failing
    P requeued    set of job ids XAUTOCLAIM took over at least once
    P stats       hash: requeue_events, dead_lettered, trimmed (pending entries whose data XAUTOCLAIM
                  found gone; Redis 7 drops them from the PEL whatever their idle time, a live
                  consumer's too, whose XACK then finds nothing: not a count of lost jobs)
Consumer group "workers" on P stream; each worker is a consumer named after itself.

Consumer names stay in the group until deleted, and each replacement brings a new one: the harness's
recovery timer (`recover`) deletes the consumers that hold no pending entry and have been idle for
stale_after (`prune_consumers`), so the group does not grow with the number of crashes.

Recovery lives in the consumers, as in production: before reading new entries, a consumer runs
XAUTOCLAIM (at most every recover_every seconds, and again at once while it finds something) for
entries idle longer than stale_after. An entry trimmed while pending has no data left to run: Redis
7 drops it from the PEL and names it in XAUTOCLAIM's third reply element, Redis 6.2 returns it with
nil fields and keeps it, so the script acknowledges it; either way it is counted in P stats trimmed,
never handed out, never retried (nothing says which job it was). The claim script reads each
claimed entry's delivery count; a job whose attempts (failures + deliveries) would exceed
max_attempts is dead-lettered (XACK + push to P dead). A failed job is XACKed and re-added, after
its backoff, as a new entry.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import ClassVar

import redis

from crashbench.designs import Design, DesignSettings, Entry, Job, QueueState, durable

GROUP = "workers"

# A Lua function for the scripts that give a pending entry back (the claim here, stream-reuse's re-read).
# KEYS: stream, dead, requeued, stats. An entry delivered once too often (its failed attempts, from its
# fields, plus its deliveries, from the PEL) is dead-lettered: nil; else its requeue is counted and its
# attempt returned.
REDELIVER = """
local function redeliver(group, eid, fields, max_attempts)
  local job, failed = '', 0
  for i = 1, #fields, 2 do
    if fields[i] == 'id' then job = fields[i + 1] end
    if fields[i] == 'attempts' then failed = tonumber(fields[i + 1]) end
  end
  local deliveries = redis.call('XPENDING', KEYS[1], group, eid, eid, 1)[1][4]
  if failed + deliveries > tonumber(max_attempts) then
    redis.call('XACK', KEYS[1], group, eid)
    redis.call('LPUSH', KEYS[2], job)
    redis.call('HINCRBY', KEYS[4], 'dead_lettered', 1)
    return nil
  end
  redis.call('SADD', KEYS[3], job)
  redis.call('HINCRBY', KEYS[4], 'requeue_events', 1)
  return failed + deliveries
end
"""

# KEYS: stream, dead, requeued, stats
# ARGV: group, consumer, min_idle_ms, count, max_attempts
# Returns {entry id, fields, attempt} for each entry claimed and not dead-lettered. Deleted (trimmed)
# entries are counted, never returned: res[3] on Redis >= 7 (already out of the PEL), nil fields on 6.2.
CLAIM = (
    REDELIVER
    + """
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4])
local out = {}
local trimmed = res[3] and #res[3] or 0
for _, entry in ipairs(res[2]) do
  local eid, fields = entry[1], entry[2]
  if not fields then  -- Lua 5.1 has no continue: the rest is the else branch
    redis.call('XACK', KEYS[1], ARGV[1], eid)
    trimmed = trimmed + 1
  else
    local attempt = redeliver(ARGV[1], eid, fields, ARGV[5])
    if attempt then table.insert(out, {eid, fields, attempt}) end
  end
end
if trimmed > 0 then redis.call('HINCRBY', KEYS[4], 'trimmed', trimmed) end
return out
"""
)

# KEYS: stream, delayed, dead, poisoned, stats
# ARGV: group, consumer, entry id, job JSON with attempts already counted, due time, max_attempts
# Only the entry's current owner moves it on: if XAUTOCLAIM gave it away meanwhile, someone else has it.
FAIL = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)[1]
if not p or p[2] ~= ARGV[2] then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
local job = cjson.decode(ARGV[4])
if job.attempts >= tonumber(ARGV[6]) then
  redis.call('LPUSH', KEYS[3], job.id)
  redis.call('SADD', KEYS[4], job.id)
  redis.call('HINCRBY', KEYS[5], 'dead_lettered', 1)
  return 2
end
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
return 1
"""

# KEYS: stream; ARGV: group, min idle ms, only this consumer ("" for any)
# Deletes each consumer with no pending entry idle at least min idle; returns their names. One script,
# so no entry can be delivered to a consumer between the look and the delete (DELCONSUMER drops a PEL).
PRUNE = """
local out = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['pending'] == 0 and info['idle'] >= tonumber(ARGV[2]) and (ARGV[3] == '' or info['name'] == ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    table.insert(out, info['name'])
  end
end
return out
"""

# KEYS: delayed, stream; ARGV: now, batch size, maxlen (0: no trim), '=' or '~'
PROMOTE = """
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
for _, raw in ipairs(due) do
  local job = cjson.decode(raw)
  redis.call('ZREM', KEYS[1], raw)
  if ARGV[3] == '0' then
    redis.call('XADD', KEYS[2], '*', 'id', job.id, 'payload', job.payload, 'attempts', job.attempts)
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[4], ARGV[3], '*', 'id', job.id, 'payload', job.payload,
               'attempts', job.attempts)
  end
end
return #due
"""


class StreamQueue(Design):
    name = "stream"
    counts_requeues = True
    waits_aof = True
    summary = "XADD + XREADGROUP + XACK, XAUTOCLAIM recovery in each consumer: at-least-once"
    DEAD_LETTERS = ("dead",)
    DELAYED = ("delayed",)
    BOOKKEEPING = ("poisoned", "requeued", "stats")
    # Whether `recover` deletes idle consumers that hold nothing (a subclass may keep them, to show the churn).
    PRUNE_CONSUMERS: ClassVar[bool] = True

    def job_of(self, key: str, entry: Entry) -> str | None:
        if key == "dead" and isinstance(entry, bytes):
            return entry.decode(errors="replace")  # the dead letters are bare job ids
        return super().job_of(key, entry)

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._claim = self.r.register_script(CLAIM)
        self._fail = self.r.register_script(FAIL)
        self._promote = self.r.register_script(PROMOTE)
        self._prune = self.r.register_script(PRUNE)
        self._next_claim = 0.0

    def setup(self) -> None:
        try:
            self.r.xgroup_create(self.key("stream"), GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def enqueue(self, jobs: Sequence[Job]) -> list[str] | None:
        # The entry ids XADD answers are returned when trimming: the harness keeps them, for the one evidence
        # of a trimmed entry (below the stream's first entry at the end), since a trimmed entry's job id is
        # gone with it. Not otherwise: at 10M jobs they would be most of the harness's memory.
        maxlen = self.settings.stream_maxlen or None
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            fields = {"id": job.id, "payload": job.payload, "attempts": 0}
            pipe.xadd(self.key("stream"), fields, maxlen=maxlen, approximate=self.settings.stream_approximate)
        durable.ask(pipe, self.settings)
        entries = pipe.execute()
        durable.check(entries, self.settings)
        return entries[: len(jobs)] if maxlen else None

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        try:
            return self._fetch(worker, timeout, now)
        except redis.ResponseError as exc:
            self._regroup(exc)
            return None

    def _regroup(self, exc: redis.ResponseError) -> None:
        """A server that lost its data (restarted without persistence) has no group: make it again,
        as a consumer does on NOGROUP. Anything else is a real error."""
        if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
            raise exc
        self.setup()

    def _fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        if now >= self._next_claim:
            claimed = self._claim(
                keys=[self.key("stream"), self.key("dead"), self.key("requeued"), self.key("stats")],
                args=[GROUP, worker, int(self.settings.stale_after * 1000), 1, self.settings.max_attempts],
            )
            if claimed:
                eid, fields, attempt = claimed[0]
                data = dict(zip(fields[::2], fields[1::2], strict=True))
                return Job(data["id"], data.get("payload", ""), receipt=eid, attempt=int(attempt))  # claim again next
            self._next_claim = now + self.settings.recover_every
        # BLOCK 0 would wait forever; never ask for less than a millisecond.
        block = max(1, int(timeout * 1000))
        resp = self.r.xreadgroup(GROUP, worker, {self.key("stream"): ">"}, count=1, block=block)
        if not resp:
            return None
        eid, fields = resp[0][1][0]
        attempt = int(fields.get("attempts", 0)) + 1
        return Job(fields["id"], fields.get("payload", ""), receipt=eid, attempt=attempt)

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        # XACK does not check the owner: a late ack by a worker whose entry was claimed acknowledges the
        # new owner's delivery (1), and the new owner's own ack then finds nothing (0).
        return bool(self.r.xack(self.key("stream"), GROUP, job.receipt))

    def fail(self, worker: str, job: Job, now: float) -> None:
        due = now + self.settings.retry_delay(job.attempt, random.random())
        retry = json.dumps({"id": job.id, "payload": job.payload, "attempts": job.attempt})
        keys = [self.key("stream"), self.key("delayed"), self.key("dead"), self.key("poisoned"), self.key("stats")]
        self._fail(keys=keys, args=[GROUP, worker, job.receipt, retry, repr(due), self.settings.max_attempts])

    def heartbeat(self, worker: str, job: Job, now: float) -> None:
        # XCLAIM of our own entry with min-idle 0 resets its idle time: the guide's stream heartbeat.
        self.r.xclaim(self.key("stream"), GROUP, worker, 0, [job.receipt], justid=True)

    def stop_worker(self, worker: str, now: float) -> None:
        # Leave the group tidy, but never drop a pending entry (DELCONSUMER would discard its PEL): look
        # and delete in one script, so that nothing can be delivered to the name in between.
        self.prune_consumers(0, only=worker)

    def recover(self, now: float) -> None:
        # Crash recovery runs in the consumers (XAUTOCLAIM); the harness's timer moves due retries.
        trim = "~" if self.settings.stream_approximate else "="
        args = [repr(now), 1000, self.settings.stream_maxlen, trim]
        self._promote(keys=[self.key("delayed"), self.key("stream")], args=args)
        if self.PRUNE_CONSUMERS:
            self.prune_consumers(int(self.settings.stale_after * 1000))

    def prune_consumers(self, idle_ms: int, only: str = "") -> list[str]:
        """Delete the consumers (only `only`, if given) that hold no pending entry and have been idle at
        least `idle_ms` (the server's idle time: since their last read or claim); their names. Losing
        nothing: a consumer with no pending entry holds no job, and a live one deleted here is made
        again by its next XREADGROUP."""
        try:
            return list(self._prune(keys=[self.key("stream")], args=[GROUP, idle_ms, only]))
        except redis.ResponseError as exc:  # no stream or no group yet (a server that came back empty)
            self._regroup(exc)
            return []

    def backlog(self) -> int:
        info = self._group()
        # Redis 7.0 miscounts a group's lag once entries it never read were trimmed (entries-read goes up
        # by one a delivery, entries-added by one an XADD): trimming, count what follows the group's cursor.
        lag = None if self.settings.stream_maxlen else info.get("lag")
        if lag is None:  # the server could not tell (old server, or entries deleted): count them
            lag = len(self.r.xrange(self.key("stream"), f"({info['last-delivered-id']}", "+"))
        return int(info["pending"]) + int(lag) + int(self.r.zcard(self.key("delayed")))

    def _group(self) -> dict:
        for _ in range(2):
            try:
                for info in self.r.xinfo_groups(self.key("stream")):
                    if info["name"] == GROUP:
                        return info
            except redis.ResponseError as exc:
                self._regroup(exc)
                continue
            self.setup()  # the stream came back (an XADD) without its group
        raise RuntimeError(f"consumer group {GROUP!r} is missing on {self.key('stream')}")

    def state(self) -> QueueState:
        stream = self.key("stream")
        held: dict[str, str] = {}
        for raw in self.r.zrange(self.key("delayed"), 0, -1):
            held[json.loads(raw)["id"]] = "delayed"
        last = self._group()["last-delivered-id"]
        for _, fields in self.r.xrange(stream, f"({last}", "+"):
            held[fields["id"]] = "pending"
        pel = self.r.xpending_range(stream, GROUP, min="-", max="+", count=1_000_000)
        if pel:
            pipe = self.r.pipeline(transaction=False)
            for p in pel:
                pipe.xrange(stream, p["message_id"], p["message_id"])
            for p, entries in zip(pel, pipe.execute(), strict=True):
                if entries:  # none: trimmed while pending, no job left to name (the next claim drops it)
                    held[entries[0][1]["id"]] = f"pel:{p['consumer']}"
        events = self.r.hget(self.key("stats"), "requeue_events")
        return QueueState(
            held=held,
            dead_lettered=set(self.r.lrange(self.key("dead"), 0, -1)),
            poisoned=set(self.r.smembers(self.key("poisoned"))),
            requeued=set(self.r.smembers(self.key("requeued"))),
            requeue_events=int(events or 0),
        )
