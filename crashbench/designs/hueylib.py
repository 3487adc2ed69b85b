"""huey: huey (3.x) with Redis storage and its own consumer (one worker thread per slot).

Keys: huey's own layout, outside crashbench's namespace (so huey refuses --redis-url), with
name = the run prefix made alphanumeric (N):
    huey.redis.N        list of pickled task messages waiting
    huey.schedule.N     sorted set of tasks waiting for their eta (retries with a delay)
    huey.results.N      results (switched off here)

huey pops a message off the list (RPOP) and runs it: nothing in Redis remembers a task a worker
holds, so a worker killed while running it loses it (at-most-once), like the naive design. huey has
no acknowledgement setting for Redis storage, so there is no second configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis
from huey import RedisHuey

from crashbench.designs import DesignSettings, Job, LibraryDesign, QueueState
from crashbench.task import handle


class HueyQueue(LibraryDesign):
    name = "huey"
    summary = "huey, Redis storage, as installed: RPOP of the task, at-most-once like naive"
    library = "huey"
    namespaced = False

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
        self.huey.create_consumer(workers=1, worker_type="thread", check_worker_health=False).run()

    def backlog(self) -> int:
        return int(self.huey.pending_count() + self.huey.scheduled_count())

    def state(self) -> QueueState:
        held = {t.args[0]: "queue" for t in self.huey.pending()}
        held |= {t.args[0]: "schedule" for t in self.huey.scheduled()}
        return QueueState(held=held)
