"""A worked example of a user-supplied design: an SQS-style visibility timeout on Redis.

    crashbench run --design examples.visibility_queue:VisibilityTimeoutQueue --kills 5

Keys (all under the run prefix P):
    P pending    list of JSON jobs {"id", "payload"}; LPUSH in, RPOP out (inside FETCH)
    P inflight   sorted set: raw job -> harness-clock deadline; ZREM is the ack
    P requeued   set of job ids put back after their deadline passed
    P stats      hash: requeue_events, how many times a job was put back

Instead of heartbeats, every fetched job gets a deadline `stale_after` seconds ahead; a job still in
flight after its deadline is put back. FETCH moves the job and sets its deadline in one script, so
there is no moment when the job exists only in the worker's memory.

crashbench reads these keys itself to place every job; the default `job_of` understands the JSON
payloads, and BOOKKEEPING tells it which keys hold ids that are not jobs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from crashbench.designs import Design, Job, QueueState

# KEYS: pending, inflight; ARGV: deadline
FETCH = """
local raw = redis.call('RPOP', KEYS[1])
if raw then redis.call('ZADD', KEYS[2], ARGV[1], raw) end
return raw
"""

# KEYS: inflight, pending, requeued, stats; ARGV: now
EXPIRE = """
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE')
for _, raw in ipairs(due) do
  redis.call('ZREM', KEYS[1], raw)
  redis.call('RPUSH', KEYS[2], raw)
  redis.call('SADD', KEYS[3], cjson.decode(raw).id)
end
if #due > 0 then redis.call('HINCRBY', KEYS[4], 'requeue_events', #due) end
return #due
"""


class VisibilityTimeoutQueue(Design):
    name = "visibility"
    summary = "RPOP + ZADD deadline in one script; expired jobs go back to pending"
    BOOKKEEPING = ("requeued", "stats")

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            pipe.lpush(self.key("pending"), json.dumps({"id": job.id, "payload": job.payload}))
        pipe.execute()

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        raw = self.r.eval(FETCH, 2, self.key("pending"), self.key("inflight"), now + self.settings.stale_after)
        if raw is None:
            time.sleep(min(timeout, 0.005))  # no blocking pop that also sets a deadline: poll
            return None
        data = json.loads(raw)
        return Job(data["id"], data["payload"], receipt=raw)

    def ack(self, worker: str, job: Job, now: float) -> None:
        self.r.zrem(self.key("inflight"), job.receipt)

    def recover(self, now: float) -> None:
        keys = [self.key("inflight"), self.key("pending"), self.key("requeued"), self.key("stats")]
        self.r.eval(EXPIRE, len(keys), *keys, now)

    def backlog(self) -> int:
        return int(self.r.llen(self.key("pending"))) + int(self.r.zcard(self.key("inflight")))

    def state(self) -> QueueState:
        held = {json.loads(raw)["id"]: "pending" for raw in self.r.lrange(self.key("pending"), 0, -1)}
        held |= {json.loads(raw)["id"]: "inflight" for raw in self.r.zrange(self.key("inflight"), 0, -1)}
        events = int(self.r.hget(self.key("stats"), "requeue_events") or 0)
        return QueueState(held=held, requeued=set(self.r.smembers(self.key("requeued"))), requeue_events=events)
