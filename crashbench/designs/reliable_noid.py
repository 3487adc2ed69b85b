"""reliable-noid and reliable-ids: the guide's LREM-by-value gotcha, measured ("LREM by value. In the list
pattern, two identical payloads are indistinguishable; include a unique job id in every payload").

Both are reliable (BLMOVE into a per-worker processing list, heartbeats, the Lua reaper, LREM as the ack)
with a prefetch: a worker's processing list holds up to batch_size jobs, the one it runs (the oldest, at
the tail) and the ones it took ahead, as a per-process working list with several jobs in flight has them
(Sidekiq Pro's super_fetch). With batch_size = 1 it is the guide's own pattern: one job per list. Every
job's payload is one of PAYLOADS values (its number modulo PAYLOADS): identical payloads are the rule.

The two differ in one thing only, what the design compares when it removes a job from a list:
    reliable-ids   the whole stored value, which carries the job's unique id: LREM by value, as shipped
    reliable-noid  the value without the id (payload and attempts): what LREM by value does when the
                   payload carries no id. The first element from the head whose payload and attempts
                   equal the acked job's is removed (ACK_BARE), which may be another job's copy.

How the counts stay per job although the design cannot tell two jobs apart: the stored value of both
designs is the same bytes, {"id", "payload", "attempts"}, and in reliable-noid the id is a tracer that no
operation of the design compares or chooses by (fetch takes by position, the ack and the failure path
remove by the bare value; the reaper and a stopping worker move whole lists). It tells the harness
which stored element each execution ran and where each one is left (the ledger records the id of the
element the worker took; the final reading finds ids in Redis), so lost, duplicated and stranded are
per job, from evidence the design does not control. Without it, identical payloads could only be
counted per value: a job lost and its twin run twice would cancel out.

What the gotcha does here: worker W holds [B, A] (A taken first, at the tail), A and B with one payload.
W runs A and acks it by value: reliable-noid removes the first match from the head, B's copy. Its list is
now [A]: W takes A again as its current job (a duplicate) and B is gone from Redis without having run
(lost). Each ack removes one element and follows one completion, so once the queue is drained, the
completions equal the jobs enqueued: extra_executions == lost (a kill adds none: the reaper moves whole
lists, and a killed handler does not complete). With one job per list (batch_size = 1) the ack finds
only the job it ran, and nothing happens: the gotcha needs two copies in one list.

Keys (all under the run prefix P), reliable's:
    P pending              list of JSON jobs {"id", "payload", "attempts"}; LPUSH in, RPOPLPUSH / BLMOVE out
    P processing:<worker>  list: the jobs <worker> holds (up to batch_size), its current one at the tail
    P workers, heartbeats, delayed, dead, poisoned, requeued, stats: as reliable's (the reaper's and a
    stopping worker's scripts are reliable's; their `requeued` set is the design's own report only)
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from crashbench.designs import DesignSettings, Job
from crashbench.designs.reliable import FAIL, ReliableQueue
from crashbench.jobids import plain

if TYPE_CHECKING:
    import redis

PAYLOADS = 2  # distinct payload values: a job's is its number modulo this

# KEYS: pending, processing, heartbeats; ARGV: worker, now, depth. Tops the worker's list up to `depth`
# jobs from pending and answers its current job (the oldest, at the tail), or nil when it holds none.
FETCH = """
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
local n = redis.call('LLEN', KEYS[2])
while n < tonumber(ARGV[3]) do
  if not redis.call('RPOPLPUSH', KEYS[1], KEYS[2]) then break end
  n = n + 1
end
if n == 0 then return false end
return redis.call('LINDEX', KEYS[2], -1)
"""

# The bare match, before ACK_BARE's and FAIL_BARE's own work. KEYS[1]: processing; ARGV[1]: the job's stored
# value, replaced by the first element from the head with the same payload and attempts (blind to the id),
# which may be another job's copy; the script answers 0 when none matches.
FIND_BARE = """
local want = cjson.decode(ARGV[1])
local found = nil
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local job = cjson.decode(raw)
  if job.payload == want.payload and job.attempts == want.attempts then found = raw; break end
end
if not found then return 0 end
ARGV[1] = found
"""

# KEYS: processing; ARGV: the acked job's stored value. LREM by value of the bare match. Answers 1, or 0.
ACK_BARE = FIND_BARE + "return redis.call('LREM', KEYS[1], 1, ARGV[1])\n"

# KEYS: processing, delayed, dead, poisoned, stats; ARGV: the failed job's stored value, due time,
# max_attempts. reliable's FAIL on the bare match: the element it removes (perhaps another job's copy) is
# the one retried later or dead-lettered.
FAIL_BARE = FIND_BARE + FAIL


def payload_of(job_id: str) -> str:
    """The payload a job carries: one of PAYLOADS values, by its number (ids not of a run: their text)."""
    text = plain(job_id)
    return f"report-{int(text) % PAYLOADS}" if text.isdigit() else text


class ReliableIds(ReliableQueue):
    name = "reliable-ids"
    summary = "reliable with a prefetch (batch_size per list), identical payloads, unique ids: LREM by value"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._fetch = self.r.register_script(FETCH)

    def enqueue(self, jobs: Sequence[Job]) -> None:
        super().enqueue([Job(j.id, payload_of(j.id), delay_s=j.delay_s) for j in jobs])

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        keys = [self.key("pending"), self.key("processing", worker), self.key("heartbeats")]
        raw = self._fetch(keys=keys, args=[worker, repr(now), max(1, self.settings.batch_size)])
        if raw is None:  # it holds nothing and pending is empty: wait for one, as reliable does
            raw = self.r.blmove(self.key("pending"), self.key("processing", worker), timeout, "RIGHT", "LEFT")
            if raw is None:
                return None
        data = json.loads(raw)
        return Job(data["id"], data["payload"], receipt=raw, attempt=data["attempts"] + 1)


class ReliableNoId(ReliableIds):
    name = "reliable-noid"
    summary = "reliable-ids whose ack removes by the payload alone, as when payloads carry no id"
    counts_requeues = False  # a job may come back by a wrong removal, which no reaper recorded

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._ack_bare = self.r.register_script(ACK_BARE)
        self._fail_bare = self.r.register_script(FAIL_BARE)

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        return bool(self._ack_bare(keys=[self.key("processing", worker)], args=[job.receipt]))

    def fail(self, worker: str, job: Job, now: float) -> None:
        due = now + self.settings.retry_delay(job.attempt, random.random())
        keys = [self.key("processing", worker), self.key("delayed"), self.key("dead"), self.key("poisoned")]
        self._fail_bare(keys=[*keys, self.key("stats")], args=[job.receipt, repr(due), self.settings.max_attempts])
