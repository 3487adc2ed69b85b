"""stream-batch: stream, reading up to batch_size entries per XREADGROUP and XACKing them in one call.

Keys (all under the run prefix P), the same as stream's, whose claim, retry and state this shares:
    P stream      the stream; each entry has fields id (job id), payload, attempts (failed attempts
                  before this entry). Entries are kept after XACK (a stream keeps history until
                  trimmed: to stream_maxlen entries on every XADD, when it is not 0)
    P delayed     sorted set: JSON job -> harness-clock time its retry is due (a new entry then)
    P dead        list of dead-lettered job ids
    P poisoned    set of job ids dead-lettered because their handler kept failing
    P requeued    set of job ids XAUTOCLAIM took over at least once
    P stats       hash: requeue_events, dead_lettered, trimmed (pending entries found gone)
Consumer group "workers" on P stream; each worker is a consumer named after itself.

A batch is delivered to the consumer's PEL at once and acked after its last job ran, so a killed
consumer's whole batch is claimed by another one (XAUTOCLAIM, also up to batch_size entries per
call): the jobs it had finished but not acked run again (at most batch_size per kill, batch_size - 1
when it lands inside a handler).

Every entry of a batch ages from its delivery, not from its start: the batch must finish within
stale_after, or XAUTOCLAIM hands its tail to another consumer (duplicates, never losses). With
heartbeat_every on, a heartbeat refreshes the whole batch for that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from crashbench.designs import DesignSettings, Job
from crashbench.designs.stream import GROUP, StreamQueue

if TYPE_CHECKING:
    import redis


class StreamBatchQueue(StreamQueue):
    name = "stream-batch"
    summary = "stream, XREADGROUP COUNT batch_size and one XACK per batch, XAUTOCLAIM recovery: at-least-once"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._batch: list[str] = []  # entry ids of the batch this consumer holds, for the heartbeat

    def fetch_batch(self, worker: str, timeout: float, now: float) -> list[Job]:
        try:
            return self._fetch_batch(worker, timeout, now)
        except redis.ResponseError as exc:
            self._regroup(exc)
            return []

    def _fetch_batch(self, worker: str, timeout: float, now: float) -> list[Job]:
        self._batch = []
        n = self.settings.batch_size
        if now >= self._next_claim:
            claimed = self._claim(
                keys=[self.key("stream"), self.key("dead"), self.key("requeued"), self.key("stats")],
                args=[GROUP, worker, int(self.settings.stale_after * 1000), n, self.settings.max_attempts],
            )
            if claimed:
                jobs = []
                for eid, fields, attempt in claimed:
                    data = dict(zip(fields[::2], fields[1::2], strict=True))
                    jobs.append(Job(data["id"], data.get("payload", ""), receipt=eid, attempt=int(attempt)))
                self._batch = [job.receipt for job in jobs]
                return jobs  # and claim again next time: there may be more where these came from
            self._next_claim = now + self.settings.recover_every
        # BLOCK 0 would wait forever; never ask for less than a millisecond.
        block = max(1, int(timeout * 1000))
        resp = self.r.xreadgroup(GROUP, worker, {self.key("stream"): ">"}, count=n, block=block)
        if not resp:
            return []
        jobs = [
            Job(fields["id"], fields.get("payload", ""), receipt=eid, attempt=int(fields.get("attempts", 0)) + 1)
            for eid, fields in resp[0][1]
        ]
        self._batch = [job.receipt for job in jobs]
        return jobs

    def ack_batch(self, worker: str, jobs: Sequence[Job], now: float) -> list[bool | None]:
        acked = self.r.xack(self.key("stream"), GROUP, *(job.receipt for job in jobs)) if jobs else 0
        self._batch = []
        # One XACK answers for the batch: which entry it found nothing for is known only at 0 or all.
        if acked in (0, len(jobs)):
            return [bool(acked)] * len(jobs)
        return [None] * len(jobs)

    def heartbeat(self, worker: str, job: Job, now: float) -> None:
        # The jobs still waiting in this batch (and the finished, unacked ones) age as much as the
        # running one; XCLAIM without FORCE skips ids already acked, e.g. a failed job's.
        ids = self._batch or [job.receipt]
        self.r.xclaim(self.key("stream"), GROUP, worker, 0, ids, justid=True)
