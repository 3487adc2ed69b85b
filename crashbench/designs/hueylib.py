"""huey: huey (3.x) with Redis storage and its own consumer (one worker thread per slot, huey's
shipped default; queue.concurrency changes it).

Keys: huey's own layout, outside crashbench's namespace (so huey refuses --redis-url), with
name = the run prefix made alphanumeric (N):
    huey.redis.N        list of pickled task messages waiting
    huey.schedule.N     sorted set of tasks waiting for their eta (retries with a delay)
    huey.results.N      results (switched off here)
    huey.counters.N, huey.notify.N.*    counters and result notifications (unused here)

Each list / sorted-set member is the whole message, so whatever holds one holds the job.

huey pops a message off the list (RPOP) and runs it: nothing in Redis remembers a task a worker
holds, so a worker killed while running it loses it (at-most-once), like the naive design. huey has
no acknowledgement setting for Redis storage, so there is no second configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from huey import RedisHuey

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState
from crashbench.designs.handler import handle
from crashbench.model.stored import Snapshot


class HueyQueue(LibraryDesign):
    name = "huey"
    summary = "huey, Redis storage, as installed: RPOP of the task, at-most-once like naive"
    library = "huey"
    namespaced = False
    drops_failed = True  # no retries configured: huey logs a task that raised and forgets it

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        # The scenario's [library.<design>]: RedisHuey arguments.
        self.huey = RedisHuey(name=prefix, url=self.url(), **{"results": False, **settings.options})
        self.task = self.huey.task(name="crashbench_handle")(handle)

    def enqueue(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.task(job.id)

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        self.huey.on_startup()(ready)  # runs in the worker thread, as it starts taking tasks
        self.huey.create_consumer(workers=self.concurrency(), worker_type="thread", check_worker_health=False).run()

    def configuration(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency(), "ack": "none (RPOP)"}

    def backlog(self) -> int:
        return int(self.huey.pending_count() + self.huey.scheduled_count())

    def state(self) -> QueueState:
        held = {t.args[0]: "queue" for t in self.huey.pending()}
        held |= {t.args[0]: "schedule" for t in self.huey.scheduled()}
        return QueueState(held=held)

    def key_patterns(self) -> list[str]:
        # huey's keys are named after the cleaned name alone ([A-Za-z0-9_], no glob characters).
        storage = self.huey.storage
        keys = [storage.queue_key, storage.schedule_key, storage.result_key, storage.counter_key]
        return [*keys, storage.notify_prefix + "*"]

    def _message_job(self, raw: bytes) -> str | None:
        """The job id of a stored message: huey's serializer (pickle) gives its Message tuple."""
        try:
            args = self.huey.serializer.deserialize(raw).args
        except Exception:  # whatever unpickling fails with, it is not one of our messages
            return None
        return args[0] if isinstance(args, tuple | list) and args and isinstance(args[0], str) else None

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        storage = self.huey.storage
        for key, where, kind in ((storage.queue_key, "queue", "held"), (storage.schedule_key, "schedule", "delayed")):
            stored = snapshot.keys.get(key)
            for raw in stored.items if stored is not None else ():
                if (job := self._message_job(raw)) is not None:
                    found.add(job, where, kind)
        return found
