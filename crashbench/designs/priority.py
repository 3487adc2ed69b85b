"""priority: reliable with two pending lists; a worker takes from high first, else from low.

Keys (all under the run prefix P):
    P high                 list of high-priority JSON jobs {"id", "payload", "attempts", "priority"};
                           LPUSH in, LMOVE RIGHT out
    P low                  the same for every other job
    P processing:<worker>  list: the jobs <worker> holds (usually one); LREM by value is the ack
    P workers              set of every worker that ever started (to find processing lists cheaply)
    P heartbeats           hash worker -> harness-clock seconds of its last sign of life
    P delayed              sorted set: JSON job -> harness-clock time its retry is due
    P dead                 list of dead-lettered JSON jobs
    P poisoned             set of job ids dead-lettered because their handler kept failing
    P requeued             set of job ids the reaper gave back at least once
    P stats                hash: requeue_events, dead_lettered

Crash safety is reliable's: a job moves atomically into its worker's processing list and only the
ack (or FAIL) removes it; the reaper gives a dead worker's jobs back. The job's priority travels in
its stored JSON, so the reaper, a graceful hand-back and the retry mover each return a job to the
list it came from. A job is high when enqueue is told so, or when its payload is a JSON object with
"priority": "high".

The lesson's exercise 3: a worker cannot block on two lists and still move atomically into its
processing list (BLMPOP pops without moving), so it blocks on low only, for at most HIGH_WAIT
seconds; that bounds how long a high job waits behind an idle worker.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Literal

from crashbench.designs import DesignSettings, Job, QueueState
from crashbench.designs.reliable import ReliableQueue

if TYPE_CHECKING:
    import redis

Priority = Literal["high", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "low")

# KEYS: high, low, processing, heartbeats; ARGV: worker, now
# The non-blocking tries of both lists (and the heartbeat) in one round trip, high first.
FETCH = """
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
local raw = redis.call('LMOVE', KEYS[1], KEYS[3], 'RIGHT', 'LEFT')
if raw then return raw end
return redis.call('LMOVE', KEYS[2], KEYS[3], 'RIGHT', 'LEFT')
"""

# reliable's reaper, returning each job to the list of its priority.
# KEYS: processing, high, low, dead, requeued, stats, heartbeats
# ARGV: max_attempts, worker, stale_before (a beat older than this is stale)
REAP = """
local beat = tonumber(redis.call('HGET', KEYS[7], ARGV[2]))
if beat and beat >= tonumber(ARGV[3]) then return {0, 0} end
local moved, dead = 0, 0
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local job = cjson.decode(raw)
  job.attempts = job.attempts + 1
  if job.attempts >= tonumber(ARGV[1]) then
    redis.call('LPUSH', KEYS[4], cjson.encode(job))
    dead = dead + 1
  else
    redis.call('RPUSH', job.priority == 'high' and KEYS[2] or KEYS[3], cjson.encode(job))
    redis.call('SADD', KEYS[5], job.id)
    moved = moved + 1
  end
end
if moved > 0 then redis.call('HINCRBY', KEYS[6], 'requeue_events', moved) end
if dead > 0 then redis.call('HINCRBY', KEYS[6], 'dead_lettered', dead) end
redis.call('HDEL', KEYS[7], ARGV[2])
return {moved, dead}
"""

# KEYS: delayed, high, low; ARGV: now, batch size
PROMOTE = """
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
for _, raw in ipairs(due) do
  redis.call('ZREM', KEYS[1], raw)
  redis.call('LPUSH', cjson.decode(raw).priority == 'high' and KEYS[2] or KEYS[3], raw)
end
return #due
"""

# KEYS: high, low, delayed, workers; ARGV: prefix for processing lists
BACKLOG = """
local n = redis.call('LLEN', KEYS[1]) + redis.call('LLEN', KEYS[2]) + redis.call('ZCARD', KEYS[3])
for _, w in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  n = n + redis.call('LLEN', ARGV[1] .. w)
end
return n
"""

# KEYS: processing, high, low, heartbeats; ARGV: worker. A graceful exit hands back what it holds.
HAND_BACK = """
local n = 0
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  redis.call('LPUSH', cjson.decode(raw).priority == 'high' and KEYS[2] or KEYS[3], raw)
  n = n + 1
end
redis.call('HDEL', KEYS[4], ARGV[1])
return n
"""


def priority_of(payload: str) -> Priority:
    """A payload asks for high priority with a JSON object holding "priority": "high"; anything else,
    JSON or not, is low, so a producer that knows nothing of priorities still gets a working queue."""
    try:
        data = json.loads(payload)
    except ValueError:
        return "low"
    return "high" if isinstance(data, dict) and data.get("priority") == "high" else "low"


class PriorityQueue(ReliableQueue):
    """Shares reliable's worker registration, ack, FAIL script (which keeps the stored JSON, and with
    it the priority) and heartbeat; everything that touches a pending list is its own."""

    name = "priority"
    summary = "reliable with high and low lists: LMOVE high first, else BLMOVE low; Lua reaper: at-least-once"
    HIGH_WAIT: ClassVar[float] = 0.1  # seconds an idle worker blocks on low before it looks at high again

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._fetch = self.r.register_script(FETCH)
        self._reap_priority = self.r.register_script(REAP)
        self._promote_priority = self.r.register_script(PROMOTE)
        self._backlog_priority = self.r.register_script(BACKLOG)
        self._hand_back_priority = self.r.register_script(HAND_BACK)

    def enqueue(self, jobs: Sequence[Job], priority: Priority | None = None) -> None:
        """`priority` puts every job in that list; without it each job's payload decides."""
        if priority is not None and priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            p = priority or priority_of(job.payload)
            pipe.lpush(self.key(p), json.dumps({"id": job.id, "payload": job.payload, "attempts": 0, "priority": p}))
        pipe.execute()

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        keys = [self.key("high"), self.key("low"), self.key("processing", worker), self.key("heartbeats")]
        raw = self._fetch(keys=keys, args=[worker, repr(now)])
        if raw is None:
            # Both empty: wait on low, briefly, so a high job arriving meanwhile is not kept waiting long.
            wait = min(timeout, self.HIGH_WAIT)
            raw = self.r.blmove(self.key("low"), self.key("processing", worker), wait, "RIGHT", "LEFT")
            if raw is None:
                return None
        data = json.loads(raw)
        return Job(data["id"], data["payload"], receipt=raw, attempt=data["attempts"] + 1)

    def stop_worker(self, worker: str, now: float) -> None:
        keys = [self.key("processing", worker), self.key("high"), self.key("low"), self.key("heartbeats")]
        self._hand_back_priority(keys=keys, args=[worker])

    def recover(self, now: float) -> None:
        stale_before = now - self.settings.stale_after
        for worker, beat in self.r.hgetall(self.key("heartbeats")).items():
            if float(beat) < stale_before:
                keys = [self.key("processing", worker), self.key("high"), self.key("low"), self.key("dead")]
                self._reap_priority(
                    keys=[*keys, self.key("requeued"), self.key("stats"), self.key("heartbeats")],
                    args=[self.settings.max_attempts, worker, repr(stale_before)],
                )
        keys = [self.key("delayed"), self.key("high"), self.key("low")]
        self._promote_priority(keys=keys, args=[repr(now), 1000])

    def backlog(self) -> int:
        keys = [self.key("high"), self.key("low"), self.key("delayed"), self.key("workers")]
        return int(self._backlog_priority(keys=keys, args=[self.key("processing", "")]))

    def state(self) -> QueueState:
        # reliable's state reads delayed, processing and the dead letters; its pending list stays
        # empty here, the two lists of this design are added on top.
        state = super().state()
        for p in PRIORITIES:
            for raw in self.r.lrange(self.key(p), 0, -1):
                state.held[json.loads(raw)["id"]] = f"pending:{p}"
        return state
