"""stream: XADD + consumer group, XACK, recovery by XAUTOCLAIM, dead letters by delivery count.

Keys (all under the run prefix P):
    P stream      the stream; each entry has fields id (job id) and payload. Entries are kept after
                  XACK (a stream keeps history until trimmed; crashbench never trims)
    P dead        list of dead-lettered job ids
    P requeued    set of job ids XAUTOCLAIM took over at least once
    P stats       hash: requeue_events, dead_lettered
Consumer group "workers" on P stream; each worker is a consumer named after itself.

Recovery lives in the consumers, as in production: before reading new entries, a consumer runs
XAUTOCLAIM (at most every recover_every seconds, and again at once while it finds something) for
entries idle longer than stale_after. The claim script reads each claimed entry's delivery count
and dead-letters (XACK + push to P dead) an entry already delivered max_attempts times.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from crashbench.designs import Design, DesignSettings, Job, QueueState

GROUP = "workers"

# KEYS: stream, dead, requeued, stats
# ARGV: group, consumer, min_idle_ms, count, max_attempts
CLAIM = """
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4])
local out = {}
for _, entry in ipairs(res[2]) do
  local eid, fields = entry[1], entry[2]
  local job = ''
  for i = 1, #fields, 2 do
    if fields[i] == 'id' then job = fields[i + 1] end
  end
  local deliveries = redis.call('XPENDING', KEYS[1], ARGV[1], eid, eid, 1)[1][4]
  if deliveries > tonumber(ARGV[5]) then
    redis.call('XACK', KEYS[1], ARGV[1], eid)
    redis.call('LPUSH', KEYS[2], job)
    redis.call('HINCRBY', KEYS[4], 'dead_lettered', 1)
  else
    redis.call('SADD', KEYS[3], job)
    redis.call('HINCRBY', KEYS[4], 'requeue_events', 1)
    table.insert(out, entry)
  end
end
return out
"""


class StreamQueue(Design):
    name = "stream"
    summary = "XADD + XREADGROUP + XACK, XAUTOCLAIM recovery in each consumer: at-least-once"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._claim = self.r.register_script(CLAIM)
        self._next_claim = 0.0

    def setup(self) -> None:
        try:
            self.r.xgroup_create(self.key("stream"), GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            pipe.xadd(self.key("stream"), {"id": job.id, "payload": job.payload})
        pipe.execute()

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        if now >= self._next_claim:
            claimed = self._claim(
                keys=[self.key("stream"), self.key("dead"), self.key("requeued"), self.key("stats")],
                args=[GROUP, worker, int(self.settings.stale_after * 1000), 1, self.settings.max_attempts],
            )
            if claimed:
                eid, fields = claimed[0]
                data = dict(zip(fields[::2], fields[1::2], strict=True))
                return Job(data["id"], data.get("payload", ""), receipt=eid)  # claim again next time
            self._next_claim = now + self.settings.recover_every
        # BLOCK 0 would wait forever; never ask for less than a millisecond.
        resp = self.r.xreadgroup(GROUP, worker, {self.key("stream"): ">"}, count=1, block=max(1, int(timeout * 1000)))
        if not resp:
            return None
        eid, fields = resp[0][1][0]
        return Job(fields["id"], fields.get("payload", ""), receipt=eid)

    def ack(self, worker: str, job: Job, now: float) -> None:
        self.r.xack(self.key("stream"), GROUP, job.receipt)

    def backlog(self) -> int:
        info = self._group()
        lag = info.get("lag")
        if lag is None:  # the server could not tell (old server, or entries deleted): count them
            lag = len(self.r.xrange(self.key("stream"), f"({info['last-delivered-id']}", "+"))
        return int(info["pending"]) + int(lag)

    def _group(self) -> dict:
        for info in self.r.xinfo_groups(self.key("stream")):
            if info["name"] == GROUP:
                return info
        raise RuntimeError(f"consumer group {GROUP!r} is missing on {self.key('stream')}")

    def state(self) -> QueueState:
        stream = self.key("stream")
        held: dict[str, str] = {}
        last = self._group()["last-delivered-id"]
        for _, fields in self.r.xrange(stream, f"({last}", "+"):
            held[fields["id"]] = "pending"
        pel = self.r.xpending_range(stream, GROUP, min="-", max="+", count=1_000_000)
        if pel:
            pipe = self.r.pipeline(transaction=False)
            for p in pel:
                pipe.xrange(stream, p["message_id"], p["message_id"])
            for p, entries in zip(pel, pipe.execute(), strict=True):
                if entries:
                    held[entries[0][1]["id"]] = f"pel:{p['consumer']}"
        events = self.r.hget(self.key("stats"), "requeue_events")
        return QueueState(
            held=held,
            dead_lettered=set(self.r.lrange(self.key("dead"), 0, -1)),
            requeued=set(self.r.smembers(self.key("requeued"))),
            requeue_events=int(events or 0),
        )
