"""dramatiq and dramatiq:reliable: Dramatiq 2.x on its Redis broker, with Dramatiq's own Worker.

Keys (all under the run prefix P, Dramatiq's `namespace`; N = P with the trailing ":" ):
    N:jobs                       list of message ids waiting
    N:jobs.msgs                  hash message id -> message (JSON; the job id is args[0])
    N:__acks__.<worker>.jobs     set of message ids a worker fetched and has not acked
    N:__heartbeats__             sorted set worker -> last heartbeat
    N:jobs.DQ, N:jobs.DQ.msgs    delayed messages (Dramatiq's retries with backoff)
    N:jobs.XQ, N:jobs.XQ.msgs    dead-lettered messages

Each slot runs `dramatiq.Worker(broker, worker_threads=1)` in-process (the `dramatiq` command runs
the same class in the processes it forks) and stops it on SIGTERM as the command does. Dramatiq acks
after the actor returns; messages of a worker whose heartbeat is older than heartbeat_timeout are
put back by a maintenance pass, which each fetch runs with probability maintenance_chance / 10^6.

    dramatiq            as installed: heartbeat_timeout 60 s, maintenance_chance 1000 (0.1% of
                        fetches), Retries middleware defaults
    dramatiq:reliable   heartbeat_timeout = queue.stale_after, maintenance on every fetch, and the
                        Retries middleware on crashbench's schedule: max_retries = max_attempts - 1,
                        min_backoff = retry_base
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from crashbench.designs import OBSERVE_MARGIN, DesignSettings, Job, LibraryDesign, QueueState, observe_for
from crashbench.task import handle

QUEUE = "jobs"


def run_message(job_id: str) -> None:
    """Dramatiq's actor: crashbench's handler, told which attempt this is (the Retries middleware counts
    the retries in the message; a redelivery after a dead worker is not a retry to Dramatiq)."""
    message = CurrentMessage.get_current_message()
    retries = int(message.options.get("retries", 0)) if message is not None else 0
    handle(job_id, attempt=retries + 1)


class DramatiqQueue(LibraryDesign):
    name = "dramatiq"
    summary = "Dramatiq 2.x, Redis broker, as installed: ack after the actor, dead workers found after 60 s"
    library = "dramatiq"
    reliable: ClassVar[bool] = False

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.ns = prefix.rstrip(":")
        options: dict = {}
        if self.reliable:
            options = {"heartbeat_timeout": int(settings.stale_after * 1000), "maintenance_chance": 1_000_000}
        options.update(settings.options)  # the scenario's [library.<design>]: RedisBroker arguments
        self.broker = RedisBroker(url=self.url(), namespace=self.ns, **options)
        self.broker.add_middleware(CurrentMessage())
        retry_options = {}
        if self.reliable:  # retries on crashbench's schedule, not Dramatiq's 15 s minimum backoff
            base_ms = int(settings.retry_base * 1000)
            retry_options = {
                "max_retries": settings.max_attempts - 1, "min_backoff": base_ms,
                "max_backoff": int(base_ms * settings.retry_factor ** settings.max_attempts),
            }  # fmt: skip
        self.actor = dramatiq.Actor(
            run_message, broker=self.broker, actor_name="crashbench_handle", queue_name=QUEUE, priority=0,
            options=retry_options,
        )  # fmt: skip

    def observe_window(self) -> float:
        # A dead worker's messages go back once its heartbeat is heartbeat_timeout old, in a
        # maintenance pass that runs on a fraction of fetches: allow twice the margin for it.
        return observe_for(self.broker.heartbeat_timeout / 1000 + OBSERVE_MARGIN)

    def enqueue(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.actor.send(job.id)

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # what the dramatiq command does on SIGTERM
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        w = dramatiq.Worker(self.broker, worker_threads=1)
        w.start()
        ready()
        while not stop.wait(0.1):
            pass
        w.stop()

    def backlog(self) -> int:
        return int(self.r.hlen(f"{self.ns}:{QUEUE}.msgs") + self.r.hlen(f"{self.ns}:{QUEUE}.DQ.msgs"))

    def _jobs(self, key: str) -> dict[str, str]:
        """message id -> job id, for a messages hash."""
        return {mid: json.loads(raw)["args"][0] for mid, raw in self.r.hgetall(key).items()}

    def state(self) -> QueueState:
        waiting = set(self.r.lrange(f"{self.ns}:{QUEUE}", 0, -1))
        held: dict[str, str] = {}
        for mid, job in self._jobs(f"{self.ns}:{QUEUE}.msgs").items():
            held[job] = "queue" if mid in waiting else "acks"
        held |= dict.fromkeys(self._jobs(f"{self.ns}:{QUEUE}.DQ.msgs").values(), "delayed")
        dead = set(self._jobs(f"{self.ns}:{QUEUE}.XQ.msgs").values())
        return QueueState(held=held, dead_lettered=dead)


class DramatiqReliable(DramatiqQueue):
    name = "dramatiq:reliable"
    summary = "Dramatiq 2.x with heartbeat_timeout = stale_after and maintenance on every fetch"
    reliable = True
