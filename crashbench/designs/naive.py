"""naive: LPUSH + BRPOP, at-most-once.

Keys (all under the run prefix P):
    P pending    list of JSON jobs {"id", "payload"}; LPUSH in, BRPOP out

BRPOP removes the job from Redis as it hands it over, so between the pop and the end of the
handler the job exists only in the worker's memory: a kill there loses it, and nothing notices.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from crashbench.designs import Design, Job, QueueState


class NaiveQueue(Design):
    name = "naive"
    summary = "LPUSH + BRPOP: at-most-once, a job popped by a dying worker is gone"
    drops_failed = True  # fail() is the base class's: the job is forgotten

    def enqueue(self, jobs: Sequence[Job]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            pipe.lpush(self.key("pending"), json.dumps({"id": job.id, "payload": job.payload}))
        pipe.execute()

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        item = self.r.brpop([self.key("pending")], timeout=timeout)
        if item is None:
            return None
        data = json.loads(item[1])
        return Job(data["id"], data["payload"])

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        return None  # nothing to acknowledge: the job left Redis when it was popped

    def backlog(self) -> int:
        return int(self.r.llen(self.key("pending")))

    def state(self) -> QueueState:
        held = {json.loads(raw)["id"]: "pending" for raw in self.r.lrange(self.key("pending"), 0, -1)}
        return QueueState(held=held)
