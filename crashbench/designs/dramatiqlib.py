"""dramatiq and dramatiq:reliable: Dramatiq 2.x on its Redis broker, with Dramatiq's own Worker.

Keys (all under the run prefix P, Dramatiq's `namespace`; N = P with the trailing ":" ):
    N:jobs                       list of message ids waiting
    N:jobs.msgs                  hash message id -> message (JSON; the job id is args[0])
    N:__acks__.<worker>.jobs     set of message ids a worker fetched and has not acked
    N:__heartbeats__             sorted set worker -> last heartbeat
    N:jobs.DQ, N:jobs.DQ.msgs    delayed messages (Dramatiq's retries with backoff)
    N:jobs.XQ, N:jobs.XQ.msgs    dead-lettered messages
    N:__acks__.<worker>.jobs.DQ  delayed messages a worker fetched and holds until their eta

The id lists and ack sets name message ids; the message, and the job id in it (args[0]), is only in
the .msgs hash, so a job is where its message body is. A message that is in the .msgs hash but in no
list and no ack set is never delivered again: it is held at "msgs-only" so the run shows it.

Each slot runs `dramatiq.Worker(broker, worker_threads=8)` in-process, Dramatiq's shipped thread
count (queue.concurrency or [library."<design>"] worker_threads changes it; the `dramatiq` command
runs the same class in the processes it forks), and stops it on SIGTERM as the command does.
Dramatiq acks after the actor returns; messages of a worker whose heartbeat is older than
heartbeat_timeout are put back by a maintenance pass, which each broker command (fetch, ack, ...)
runs with probability maintenance_chance / 10^6. A worker heartbeats only through those commands:
while every thread runs a job and its prefetch is full it sends none, so a heartbeat_timeout below
the longest job lets maintenance hand running jobs to other workers.

    dramatiq            as installed: heartbeat_timeout 60 s, maintenance_chance 1000 (0.1% of
                        commands), Retries middleware defaults
    dramatiq:reliable   heartbeat_timeout above the longest job (LibraryDesign.job_timeout),
                        maintenance on every command, and the Retries middleware on crashbench's
                        schedule: max_retries = max_attempts - 1, min_backoff = retry_base
"""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState
from crashbench.designs.handler import handle
from crashbench.model.stored import Snapshot

QUEUE = "jobs"
MAINTENANCE_SCALE = 1_000_000  # maintenance_chance is out of this many commands
IDLE_POLL_S = 1.0  # an idle consumer backs off to one fetch per worker_timeout (1 s as shipped)
DELAYED = f"{QUEUE}.DQ"  # Dramatiq's delay queue for QUEUE
DEAD = f"{QUEUE}.XQ"  # and its dead-letter queue


def _message_job(raw: bytes) -> str | None:
    """The job id a stored Dramatiq message carries (its first argument), or None."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    args = message.get("args") if isinstance(message, dict) else None
    return args[0] if isinstance(args, list) and args and isinstance(args[0], str) else None


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
    drops_failed = False  # the Retries middleware retries a message that raised, then dead-letters it (XQ)
    DEFAULT_CONCURRENCY = 8  # dramatiq.Worker's worker_threads default

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.ns = prefix.rstrip(":")
        options: dict = {}
        if self.reliable:
            options = {"heartbeat_timeout": int(self.job_timeout() * 1000), "maintenance_chance": MAINTENANCE_SCALE}
        # The scenario's [library.<design>]: RedisBroker arguments, and the Worker's worker_threads.
        options.update(settings.options)
        self.threads = int(options.pop("worker_threads", self.concurrency()))
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

    def redelivery_s(self) -> float:
        # A dead worker's messages go back once its heartbeat is heartbeat_timeout old, in the first
        # maintenance pass after that; with one command per second at the least (idle consumers), a
        # pass is expected within 10^6 / maintenance_chance seconds.
        chance = max(1, self.broker.maintenance_chance)
        return self.broker.heartbeat_timeout / 1000 + MAINTENANCE_SCALE / chance * IDLE_POLL_S

    def configuration(self) -> dict[str, Any]:
        return {
            "concurrency": self.threads, "heartbeat_timeout_s": self.broker.heartbeat_timeout / 1000,
            "maintenance_chance": self.broker.maintenance_chance,
        }  # fmt: skip

    def config_warnings(self) -> list[str]:
        return self.library_timeout_warning(
            "heartbeat_timeout", self.broker.heartbeat_timeout / 1000,
            "a worker whose threads and prefetch are all taken by long jobs sends no heartbeat, so maintenance"
            " gives its running jobs to others",
        )  # fmt: skip

    def enqueue(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.actor.send(job.id)

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # what the dramatiq command does on SIGTERM
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        w = dramatiq.Worker(self.broker, worker_threads=self.threads)
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

    def _acked(self, snapshot: Snapshot) -> dict[str, dict[bytes, list[str]]]:
        """queue name -> message id -> the workers whose ack set for that queue holds it."""
        marker = self.key("__acks__.")
        acked: dict[str, dict[bytes, list[str]]] = {}
        for name, stored in snapshot.keys.items():
            if name.startswith(marker) and stored.type == "set":
                worker, _, queue = name.removeprefix(marker).partition(".")  # worker ids have no "."
                for mid in stored.items:
                    acked.setdefault(queue, {}).setdefault(mid, []).append(worker)
        return acked

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        acked = self._acked(snapshot)
        for queue, kind in ((QUEUE, "held"), (DELAYED, "delayed")):
            listed = snapshot.keys.get(self.key(queue))
            waiting = Counter(listed.items if listed is not None else ())
            bodies = snapshot.keys.get(self.key(f"{queue}.msgs"))
            for mid, raw in bodies.fields.items() if bodies is not None else ():
                if (job := _message_job(raw)) is None:
                    continue
                places = ["queue"] * waiting[mid] + [f"acks:{w}" for w in acked.get(queue, {}).get(mid, [])]
                if not places:
                    found.add(job, "msgs-only")  # not delayed either: no worker will ever fetch it
                for where in places:
                    found.add(job, where if kind == "held" else f"delayed:{where}", kind)
        dead = snapshot.keys.get(self.key(f"{DEAD}.msgs"))
        for raw in dead.fields.values() if dead is not None else ():
            if (job := _message_job(raw)) is not None:
                found.add(job, "XQ", "dead")
        return found


class DramatiqReliable(DramatiqQueue):
    name = "dramatiq:reliable"
    summary = "Dramatiq 2.x with heartbeat_timeout above the longest job and maintenance on every command"
    reliable = True
