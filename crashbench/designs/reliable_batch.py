"""reliable-batch: reliable, moving up to batch_size jobs per round trip and acking them together.

Keys (all under the run prefix P), the same as reliable's, whose recovery, retries and state this shares:
    P pending              list of JSON jobs {"id", "payload", "attempts"}; LPUSH in, LMOVE RIGHT out
    P processing:<worker>  list: the jobs of <worker>'s current batch (up to batch_size); LREM by value (in
                           one script call for the batch) is the ack
    P workers              set of every worker that ever started (to find processing lists cheaply)
    P heartbeats           hash worker -> harness-clock seconds of its last sign of life
    P delayed              sorted set: JSON job -> harness-clock time its retry is due
    P dead                 list of dead-lettered JSON jobs
    P poisoned             set of job ids dead-lettered because their handler kept failing
    P requeued             set of job ids the reaper gave back at least once
    P stats                hash: requeue_events, dead_lettered

One Lua call moves a whole batch from pending into the worker's processing list, so each job is
stored somewhere at every instant, as in reliable. The worker acks the finished jobs only after the
last one of the batch ran, so a killed worker's whole list goes back through the reaper: the jobs it
had finished but not acked run again (at most batch_size per kill, batch_size - 1 when it
lands inside a handler), none is lost.

The heartbeat is written at fetch time only (and inside handlers when heartbeat_every is on): a
batch must finish within stale_after, or the reaper takes it back from a live worker (duplicates).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from crashbench.designs import DesignSettings, Job
from crashbench.designs.reliable import ReliableQueue

if TYPE_CHECKING:
    import redis

# KEYS: pending, processing, heartbeats; ARGV: worker, now, batch size
# The heartbeat rides in the same call, like reliable's pipelined one.
FETCH_BATCH = """
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
local out = {}
for i = 1, tonumber(ARGV[3]) do
  local raw = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not raw then break end
  out[i] = raw
end
return out
"""


# KEYS: processing; ARGV: the receipts of the finished jobs. One call however many: the client packs
# one command instead of one LREM per job, which is what limits a Python worker at batch rates.
ACK_BATCH = """
local removed = {}
for i = 1, #ARGV do
  removed[i] = redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return removed
"""


def _job(raw: str) -> Job:
    data = json.loads(raw)
    return Job(data["id"], data["payload"], receipt=raw, attempt=data["attempts"] + 1)


class ReliableBatchQueue(ReliableQueue):
    name = "reliable-batch"
    summary = "reliable, batch_size jobs per Lua LMOVE call and one Lua LREM call to ack them: at-least-once"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._fetch_batch = self.r.register_script(FETCH_BATCH)
        self._ack_batch = self.r.register_script(ACK_BATCH)

    def fetch_batch(self, worker: str, timeout: float, now: float) -> list[Job]:
        keys = [self.key("pending"), self.key("processing", worker), self.key("heartbeats")]
        raws = self._fetch_batch(keys=keys, args=[worker, repr(now), self.settings.batch_size])
        if raws:
            return [_job(raw) for raw in raws]
        # Nothing waiting: block on one job instead of spinning on the script; a batch is not worth
        # waiting for, since an idle queue would then hand out batches of one anyway.
        job = self.fetch(worker, timeout, now)
        return [] if job is None else [job]

    def ack_batch(self, worker: str, jobs: Sequence[Job], now: float) -> list[bool | None]:
        # LREM by value rather than one DEL of the list: ack_batch promises to forget exactly `jobs`,
        # and a caller that acks part of a batch must not drop the rest of it with them.
        removed = self._ack_batch(keys=[self.key("processing", worker)], args=[job.receipt for job in jobs])
        return [bool(n) for n in removed]
