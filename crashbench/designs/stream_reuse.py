"""stream-reuse: stream, but a replacement takes its slot's consumer name and re-reads that name's
pending entries (XREADGROUP ... 0) before anything else, instead of waiting for XAUTOCLAIM's idle time.

Keys (all under the run prefix P), the same as stream's, whose claim, retry and state this shares:
    P stream      the stream; each entry has fields id (job id), payload, attempts (failed attempts
                  before this entry). Entries are kept after XACK until trimmed (stream_maxlen, as
                  in stream)
    P delayed     sorted set: JSON job -> harness-clock time its retry is due (a new entry then)
    P dead        list of dead-lettered job ids
    P poisoned    set of job ids dead-lettered because their handler kept failing
    P requeued    set of job ids recovery (a claim, or a re-read of a consumer's own entries) gave back
    P stats       hash: requeue_events, dead_lettered, trimmed
Consumer group "workers" on P stream; a worker is the consumer named after its slot, "slot<N>" (the
slot the supervisor gives it in SLOT_ENV; its own worker name where there is none), so a crashed
worker's replacement is the same consumer, as a pod of a StatefulSet keeps its name.

Until that name's pending list is empty, a consumer fetches from it (XREADGROUP with id 0, which counts
a delivery as a claim does), oldest first; an entry delivered max_attempts times is dead-lettered. A
dead predecessor's job then comes back as soon as the replacement is ready. XAUTOCLAIM stays for what
no replacement takes over (a paused worker keeps its slot and gets none).

The misuse it shows: the name is taken to mean "whoever had it before is dead". When that one is not
(a worker stopping gracefully still finishes its job while its slot's replacement starts; a paused
worker some supervisor replaced), two live consumers share one name and one pending list, and the
replacement runs again, at once, the job the other is still running: no idle time protects it.
"""

from __future__ import annotations

import os

import redis

from crashbench.designs import DesignSettings, Job
from crashbench.designs.stream import GROUP, REDELIVER, StreamQueue
from crashbench.model.queue import SLOT_ENV

# KEYS: stream, dead, requeued, stats
# ARGV: group, consumer, max_attempts
# The consumer's oldest pending entry, delivered to it again: {entry id, fields, attempt}; {} when it has
# none left. Entries past max_attempts are dead-lettered on the way, and entries whose data is gone
# (trimmed, deleted) acknowledged: there is no job left to run.
DRAIN = (
    REDELIVER
    + """
while true do
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '0')
  local entry = res[1][2][1]
  if not entry then return {} end
  local eid, fields = entry[1], entry[2]
  if not fields then
    redis.call('XACK', KEYS[1], ARGV[1], eid)
  else
    local attempt = redeliver(ARGV[1], eid, fields, ARGV[3])
    if attempt then return {eid, fields, attempt} end
  end
end
"""
)


class StreamReuseQueue(StreamQueue):
    name = "stream-reuse"
    summary = "stream; a replacement reuses its slot's consumer name and re-reads its pending entries first"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._drain = self.r.register_script(DRAIN)
        slot = os.environ.get(SLOT_ENV)
        self.slot_name = f"slot{slot}" if slot else None
        self._own = True  # this name's pending list may hold entries: read it before new ones

    def consumer(self, worker: str) -> str:
        """The consumer name `worker` reads as: its slot's."""
        return self.slot_name or worker

    def start_worker(self, worker: str, now: float) -> None:
        self._own = True  # also after a reconnect: what this name held may not have been acknowledged

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        name = self.consumer(worker)
        if self._own:
            try:
                got = self._drain(
                    keys=[self.key("stream"), self.key("dead"), self.key("requeued"), self.key("stats")],
                    args=[GROUP, name, self.settings.max_attempts],
                )
            except redis.ResponseError as exc:
                self._regroup(exc)
                return None
            if got:
                eid, fields, attempt = got
                data = dict(zip(fields[::2], fields[1::2], strict=True))
                return Job(data["id"], data.get("payload", ""), receipt=eid, attempt=int(attempt))
            self._own = False
        return super().fetch(name, timeout, now)

    def fail(self, worker: str, job: Job, now: float) -> None:
        super().fail(self.consumer(worker), job, now)

    def heartbeat(self, worker: str, job: Job, now: float) -> None:
        super().heartbeat(self.consumer(worker), job, now)

    def stop_worker(self, worker: str, now: float) -> None:
        # Another live process may share the name: stream's delete holds back only if it holds nothing.
        super().stop_worker(self.consumer(worker), now)
