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

from crashbench.designs import DesignSettings, Job, QueueState, durable
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
    it the priority), heartbeat, and the reaper, retry mover, backlog and hand-back scripts, which
    route a "priority": "high" job to the high list given as their optional last key. The fetch and
    the enqueue are its own."""

    PENDING = "low"

    name = "priority"
    summary = "reliable with high and low lists: LMOVE high first, else BLMOVE low; Lua reaper: at-least-once"
    HIGH_WAIT: ClassVar[float] = 0.1  # seconds an idle worker blocks on low before it looks at high again

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._fetch = self.r.register_script(FETCH)

    def _high(self) -> list[str]:
        return [self.key("high")]

    def enqueue(self, jobs: Sequence[Job], priority: Priority | None = None) -> None:
        """`priority` puts every job in that list; without it each job's payload decides."""
        if priority is not None and priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            p = priority or priority_of(job.payload)
            pipe.lpush(self.key(p), json.dumps({"id": job.id, "payload": job.payload, "attempts": 0, "priority": p}))
        durable.ask(pipe, self.settings)
        durable.check(pipe.execute(), self.settings)

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

    def state(self) -> QueueState:
        # reliable's state reads the low list (as "pending"), delayed, processing and the dead
        # letters; both lists are labelled with their priority on top.
        state = super().state()
        for p in PRIORITIES:
            for raw in self.r.lrange(self.key(p), 0, -1):
                state.held[json.loads(raw)["id"]] = f"pending:{p}"
        return state
