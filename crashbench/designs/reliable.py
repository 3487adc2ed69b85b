"""reliable: BLMOVE into a per-worker processing list, heartbeats, LREM ack, Lua reaper, delayed retries.

Keys (all under the run prefix P):
    P pending              list of JSON jobs {"id", "payload", "attempts"}; LPUSH in, BLMOVE RIGHT out
    P processing:<worker>  list: the jobs <worker> holds (usually one); LREM by value is the ack
    P workers              set of every worker that ever started (to find processing lists cheaply)
    P heartbeats           hash worker -> harness-clock seconds of its last sign of life
    P delayed              sorted set: JSON job -> harness-clock time its retry is due
    P dead                 list of dead-lettered JSON jobs
    P poisoned             set of job ids dead-lettered because their handler kept failing
    P requeued             set of job ids the reaper (or a worker handing back what it held) gave back
    P stats                hash: requeue_events, dead_lettered

The job is always stored somewhere: BLMOVE moves it atomically from pending to the worker's list,
and only the ack (or the FAIL script, which moves it on atomically) removes it. `attempts` counts
deliveries that did not succeed (a crash the reaper noticed, or a failure); once a job has been
delivered max_attempts times it goes to `dead` instead of back to pending.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Sequence
from typing import ClassVar

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from crashbench.designs import Design, DesignSettings, EnqueueUnconfirmed, Job, QueueState, durable

# KEYS: processing, pending, dead, requeued, stats, heartbeats [, high]
# ARGV: max_attempts, worker, stale_before (a beat older than this is stale)
# Re-checks the heartbeat inside the script so a worker that beat since the reaper looked is spared.
# The optional last key of this and the scripts below is the priority design's high list: a job whose
# JSON says "priority": "high" goes back there, every other one to pending.
REAP = """
local beat = tonumber(redis.call('HGET', KEYS[6], ARGV[2]))
if beat and beat >= tonumber(ARGV[3]) then return {0, 0} end
local moved, dead = 0, 0
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local job = cjson.decode(raw)
  job.attempts = job.attempts + 1
  if job.attempts >= tonumber(ARGV[1]) then
    redis.call('LPUSH', KEYS[3], cjson.encode(job))
    dead = dead + 1
  else
    redis.call('RPUSH', (KEYS[7] and job.priority == 'high') and KEYS[7] or KEYS[2], cjson.encode(job))
    redis.call('SADD', KEYS[4], job.id)
    moved = moved + 1
  end
end
if moved > 0 then redis.call('HINCRBY', KEYS[5], 'requeue_events', moved) end
if dead > 0 then redis.call('HINCRBY', KEYS[5], 'dead_lettered', dead) end
redis.call('HDEL', KEYS[6], ARGV[2])
return {moved, dead}
"""

# KEYS: processing, delayed, dead, poisoned, stats; ARGV: raw job, due time, max_attempts
# Only a job still in this worker's list moves on: if the reaper took it meanwhile, someone else has it.
FAIL = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
local job = cjson.decode(ARGV[1])
job.attempts = job.attempts + 1
if job.attempts >= tonumber(ARGV[3]) then
  redis.call('LPUSH', KEYS[3], cjson.encode(job))
  redis.call('SADD', KEYS[4], job.id)
  redis.call('HINCRBY', KEYS[5], 'dead_lettered', 1)
  return 2
end
redis.call('ZADD', KEYS[2], ARGV[2], cjson.encode(job))
return 1
"""

# The lesson's delayed-jobs mover. KEYS: delayed, pending [, high]; ARGV: now, batch size
PROMOTE = """
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
for _, job in ipairs(due) do
  redis.call('ZREM', KEYS[1], job)
  redis.call('LPUSH', (KEYS[3] and cjson.decode(job).priority == 'high') and KEYS[3] or KEYS[2], job)
end
return #due
"""

# KEYS: pending, delayed, workers [, high], then the processing lists of the workers the caller knows of
# ARGV: how many processing lists KEYS ends with, the prefix of a processing list's name
# A script names every key it reads (a cluster's rule, which routes it by them), so the caller passes the
# processing lists; a worker registered since it last looked makes the script answer -1 (counting
# without its list could say drained while it holds a job), and the caller reads the set and asks again.
BACKLOG = """
local fixed = #KEYS - tonumber(ARGV[1])
local known = {}
for i = fixed + 1, #KEYS do known[KEYS[i]] = true end
for _, w in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if not known[ARGV[2] .. w] then return -1 end
end
local n = redis.call('LLEN', KEYS[1]) + redis.call('ZCARD', KEYS[2])
if fixed == 4 then n = n + redis.call('LLEN', KEYS[4]) end
for i = fixed + 1, #KEYS do n = n + redis.call('LLEN', KEYS[i]) end
return n
"""

# KEYS: processing, pending, heartbeats, requeued, stats [, high]; ARGV: worker. A graceful exit (or a
# worker that lost its connection) hands back what it holds: requeues, recorded as the reaper's are.
HAND_BACK = """
local n = 0
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local job = cjson.decode(raw)
  redis.call('LPUSH', (KEYS[6] and job.priority == 'high') and KEYS[6] or KEYS[2], raw)
  redis.call('SADD', KEYS[4], job.id)
  n = n + 1
end
if n > 0 then redis.call('HINCRBY', KEYS[5], 'requeue_events', n) end
redis.call('HDEL', KEYS[3], ARGV[1])
return n
"""


class ReliableQueue(Design):
    name = "reliable"
    counts_requeues = True
    waits_aof = True
    summary = "BLMOVE to a per-worker processing list + heartbeats + Lua reaper: at-least-once"
    PENDING: ClassVar[str] = "pending"  # the list jobs wait in (the priority design's low list)
    DEAD_LETTERS = ("dead",)
    DELAYED = ("delayed",)
    BOOKKEEPING = ("workers", "heartbeats", "poisoned", "requeued", "stats")

    def _high(self) -> list[str]:
        """The scripts' optional last key: where a "priority": "high" job goes back (priority design)."""
        return []

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._reap = self.r.register_script(REAP)
        self._fail = self.r.register_script(FAIL)
        self._promote = self.r.register_script(PROMOTE)
        self._backlog = self.r.register_script(BACKLOG)
        self._hand_back = self.r.register_script(HAND_BACK)
        self._processing: list[str] = []  # the processing lists backlog() knows of

    def enqueue(self, jobs: Sequence[Job]) -> None:
        client = self.r
        if self.settings.wait_replicas and isinstance(self.r, RedisCluster):
            # A cluster pipeline sends WAIT, which names no key, to some node other than the pushes',
            # where it confirms nothing about them: both go on one connection to the primary of the
            # run's slot instead, as on one server.
            client = self.r.get_node_from_key(self.key("pending")).redis_connection
        pipe = client.pipeline(transaction=False)
        for job in jobs:
            pipe.lpush(self.key("pending"), json.dumps({"id": job.id, "payload": job.payload, "attempts": 0}))
        if self.settings.wait_replicas:
            # Durable only once a replica has it: a failover before that loses an acknowledged job.
            pipe.wait(self.settings.wait_replicas, self.settings.wait_ms)
        durable.ask(pipe, self.settings)
        try:
            replies = pipe.execute()
        except redis.RedisError as exc:
            if client is self.r:
                raise
            with contextlib.suppress(redis.RedisError, RedisClusterException):
                self.r.nodes_manager.initialize()  # a failover moved the slot: the next enqueue goes there
            if isinstance(exc, redis.exceptions.MovedError):  # the old primary, demoted: nothing was pushed
                raise EnqueueUnconfirmed(f"moved: {exc}") from None
            raise
        durable.check(replies, self.settings)
        wanted = self.settings.wait_replicas
        if wanted and replies[-1 - bool(self.settings.wait_aof)] < wanted:
            raise EnqueueUnconfirmed(f"{replies[-1]} of {wanted} replicas in {self.settings.wait_ms} ms")

    def start_worker(self, worker: str, now: float) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.sadd(self.key("workers"), worker)
        pipe.hset(self.key("heartbeats"), worker, repr(now))
        pipe.execute()

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        # One round trip: the heartbeat rides in the same pipeline as the blocking move.
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.key("heartbeats"), worker, repr(now))
        pipe.blmove(self.key("pending"), self.key("processing", worker), timeout, "RIGHT", "LEFT")
        raw = pipe.execute()[1]
        if raw is None:
            return None
        data = json.loads(raw)
        return Job(data["id"], data["payload"], receipt=raw, attempt=data["attempts"] + 1)

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        return bool(self.r.lrem(self.key("processing", worker), 1, job.receipt))

    def fail(self, worker: str, job: Job, now: float) -> None:
        due = now + self.settings.retry_delay(job.attempt, random.random())
        keys = [self.key("processing", worker), self.key("delayed"), self.key("dead"), self.key("poisoned")]
        self._fail(keys=[*keys, self.key("stats")], args=[job.receipt, repr(due), self.settings.max_attempts])

    def heartbeat(self, worker: str, job: Job, now: float) -> None:
        self.r.hset(self.key("heartbeats"), worker, repr(now))

    def stop_worker(self, worker: str, now: float) -> None:
        keys = [self.key("processing", worker), self.key(self.PENDING), self.key("heartbeats"), self.key("requeued")]
        self._hand_back(keys=[*keys, self.key("stats"), *self._high()], args=[worker])

    def recover(self, now: float) -> int | None:
        stale_before = now - self.settings.stale_after
        gave_back = 0
        for worker, beat in self.r.hgetall(self.key("heartbeats")).items():
            if float(beat) < stale_before:
                keys = [self.key("processing", worker), self.key(self.PENDING), self.key("dead"), self.key("requeued")]
                moved, dead = self._reap(
                    keys=[*keys, self.key("stats"), self.key("heartbeats"), *self._high()],
                    args=[self.settings.max_attempts, worker, repr(stale_before)],
                )
                gave_back += int(moved) + int(dead)
        self._promote(keys=[self.key("delayed"), self.key(self.PENDING), *self._high()], args=[repr(now), 1000])
        return gave_back

    def backlog(self) -> int:
        keys = [self.key(self.PENDING), self.key("delayed"), self.key("workers"), *self._high()]
        while True:  # the set of workers only grows: at most a few rounds
            args = [len(self._processing), self.key("processing", "")]
            n = int(self._backlog(keys=[*keys, *self._processing], args=args))
            if n >= 0:
                return n
            self._processing = [self.key("processing", w) for w in sorted(self.r.smembers(self.key("workers")))]

    def state(self) -> QueueState:
        held: dict[str, str] = {}
        for raw in self.r.lrange(self.key(self.PENDING), 0, -1):
            held[json.loads(raw)["id"]] = "pending"
        for raw in self.r.zrange(self.key("delayed"), 0, -1):
            held[json.loads(raw)["id"]] = "delayed"
        for worker in sorted(self.r.smembers(self.key("workers"))):
            for raw in self.r.lrange(self.key("processing", worker), 0, -1):
                held[json.loads(raw)["id"]] = f"processing:{worker}"
        events = self.r.hget(self.key("stats"), "requeue_events")
        return QueueState(
            held=held,
            dead_lettered={json.loads(raw)["id"] for raw in self.r.lrange(self.key("dead"), 0, -1)},
            poisoned=set(self.r.smembers(self.key("poisoned"))),
            requeued=set(self.r.smembers(self.key("requeued"))),
            requeue_events=int(events or 0),
        )
