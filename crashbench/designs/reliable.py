"""reliable: BLMOVE into a per-worker processing list, heartbeats, LREM ack, Lua reaper.

Keys (all under the run prefix P):
    P pending              list of JSON jobs {"id", "payload", "attempts"}; LPUSH in, BLMOVE RIGHT out
    P processing:<worker>  list: the jobs <worker> holds (usually one); LREM by value is the ack
    P workers              set of every worker that ever started (to find processing lists cheaply)
    P heartbeats           hash worker -> harness-clock seconds of its last fetch
    P dead                 list of dead-lettered JSON jobs
    P requeued             set of job ids the reaper gave back at least once
    P stats                hash: requeue_events, dead_lettered

The job is always stored somewhere: BLMOVE moves it atomically from pending to the worker's list,
and only the ack removes it. `attempts` counts deliveries that ended in recovery; the reaper moves a
job to `dead` instead of pending once it has been delivered max_attempts times.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from crashbench.designs import Design, DesignSettings, Job, QueueState

if TYPE_CHECKING:
    import redis

# KEYS: processing, pending, dead, requeued, stats, heartbeats
# ARGV: max_attempts, worker, stale_before (a beat older than this is stale)
# Re-checks the heartbeat inside the script so a worker that beat since the reaper looked is spared.
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
    redis.call('RPUSH', KEYS[2], cjson.encode(job))
    redis.call('SADD', KEYS[4], job.id)
    moved = moved + 1
  end
end
if moved > 0 then redis.call('HINCRBY', KEYS[5], 'requeue_events', moved) end
if dead > 0 then redis.call('HINCRBY', KEYS[5], 'dead_lettered', dead) end
redis.call('HDEL', KEYS[6], ARGV[2])
return {moved, dead}
"""

# KEYS: pending, workers; ARGV: prefix for processing lists
BACKLOG = """
local n = redis.call('LLEN', KEYS[1])
for _, w in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  n = n + redis.call('LLEN', ARGV[1] .. w)
end
return n
"""


class ReliableQueue(Design):
    name = "reliable"
    summary = "BLMOVE to a per-worker processing list + heartbeats + Lua reaper: at-least-once"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._reap = self.r.register_script(REAP)
        self._backlog = self.r.register_script(BACKLOG)

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            pipe.lpush(self.key("pending"), json.dumps({"id": job.id, "payload": job.payload, "attempts": 0}))
        pipe.execute()

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
        return Job(data["id"], data["payload"], receipt=raw)

    def ack(self, worker: str, job: Job, now: float) -> None:
        self.r.lrem(self.key("processing", worker), 1, job.receipt)

    def recover(self, now: float) -> None:
        stale_before = now - self.settings.stale_after
        for worker, beat in self.r.hgetall(self.key("heartbeats")).items():
            if float(beat) < stale_before:
                self._reap(
                    keys=[
                        self.key("processing", worker),
                        self.key("pending"),
                        self.key("dead"),
                        self.key("requeued"),
                        self.key("stats"),
                        self.key("heartbeats"),
                    ],
                    args=[self.settings.max_attempts, worker, repr(stale_before)],
                )

    def backlog(self) -> int:
        return int(self._backlog(keys=[self.key("pending"), self.key("workers")], args=[self.key("processing", "")]))

    def state(self) -> QueueState:
        held: dict[str, str] = {}
        for raw in self.r.lrange(self.key("pending"), 0, -1):
            held[json.loads(raw)["id"]] = "pending"
        for worker in sorted(self.r.smembers(self.key("workers"))):
            for raw in self.r.lrange(self.key("processing", worker), 0, -1):
                held[json.loads(raw)["id"]] = f"processing:{worker}"
        dead = {json.loads(raw)["id"] for raw in self.r.lrange(self.key("dead"), 0, -1)}
        events = self.r.hget(self.key("stats"), "requeue_events")
        return QueueState(
            held=held,
            dead_lettered=dead,
            requeued=set(self.r.smembers(self.key("requeued"))),
            requeue_events=int(events or 0),
        )
