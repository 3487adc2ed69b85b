"""dramatiq and dramatiq:reliable: Dramatiq 2.x on its Redis broker, with Dramatiq's own Worker.

Keys (all under the run prefix P, Dramatiq's `namespace`; N = P with the trailing ":" ; Q = jobs, or
with an [app] the queue_name of the user's actor):
    N:Q                          list of message ids waiting
    N:Q.msgs                     hash message id -> message (JSON; the job id is args[0], with an
                                 [app] the message's message_id)
    N:__acks__.<worker>.Q        set of message ids a worker fetched and has not acked
    N:__heartbeats__             sorted set worker -> last heartbeat
    N:Q.DQ, N:Q.DQ.msgs          delayed messages (Dramatiq's retries with backoff; a delayed send)
    N:Q.XQ, N:Q.XQ.msgs          dead-lettered messages
    N:__acks__.<worker>.Q.DQ     delayed messages a worker fetched and holds until their eta

The id lists and ack sets name message ids (Dramatiq's redis_message_id, new at each enqueue); the
message, and the job id in it, is only in the .msgs hash, so a job is where its message body is. A
message that is in the .msgs hash but in no list and no ack set is never delivered again: it is held
at "msgs-only" so the run shows it.

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

With an [app] (crashbench.designs.app), `--app module:broker` names the user's RedisBroker (or an actor
of it, or `--app module`: the global broker its actors were declared on) and `--task` an actor's name.
The user's broker runs as the user configured it (heartbeat_timeout, maintenance_chance, middleware,
the actor's options), with only its connection swapped for the run's server and its namespace for N,
in both designs alike; a broker that is not a RedisBroker is refused. A job is one message whose
message_id is crashbench's job id (Dramatiq keeps it across retries and redeliveries), sent through
broker.enqueue like actor.send_with_options. The ledger comes from a Dramatiq middleware added to the
broker in each worker: before_process_message starts a job, after_process_message ends it (or fails
it when the actor raised), after_skip_message fails it.
"""

from __future__ import annotations

import json
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message
from dramatiq.middleware import CurrentMessage, Middleware

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.model.stored import Snapshot

QUEUE = "jobs"
MAINTENANCE_SCALE = 1_000_000  # maintenance_chance is out of this many commands
IDLE_POLL_S = 1.0  # an idle consumer backs off to one fetch per worker_timeout (1 s as shipped)


def _message_job(raw: bytes | str, app: bool = False) -> str | None:
    """The job id a stored Dramatiq message carries (its first argument; with an [app], its
    message_id), or None."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    if app:
        mid = message.get("message_id")
        return mid if isinstance(mid, str) and user.ours(mid) else None
    args = message.get("args")
    return args[0] if isinstance(args, list) and args and isinstance(args[0], str) else None


class Ledger(Middleware):
    """The ledger of a user's actor, from Dramatiq's own middleware hooks (in the worker thread that
    runs the message): ids that are not crashbench's jobs are ignored (crashbench.designs.app)."""

    def __init__(self) -> None:
        self.running: set[str] = set()  # started here and not yet ended or failed

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.running.add(message.message_id)
        user.started(message.message_id)

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        if message.message_id in self.running:
            self.running.discard(message.message_id)
            (user.ended if exception is None else user.failed)(message.message_id)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        if message.message_id in self.running:  # skipped after it started: a failed attempt
            self.running.discard(message.message_id)
            user.failed(message.message_id)


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
    runs_apps = True
    drops_failed = False  # the Retries middleware retries a message that raised, then dead-letters it (XQ)
    delays = True  # send_with_options(delay=ms): the message waits in Q.DQ, then a worker holds it until its eta
    DEFAULT_CONCURRENCY = 8  # dramatiq.Worker's worker_threads default

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.ns = prefix.rstrip(":")
        self.queue = QUEUE
        if settings.task:
            self._user_actor()
            return
        options: dict = {}
        if self.reliable:
            options = {"heartbeat_timeout": int(self.job_timeout() * 1000), "maintenance_chance": MAINTENANCE_SCALE}
        # The scenario's [library.<design>]: RedisBroker arguments, and the Worker's worker_threads.
        options.update(settings.options)
        self.threads = int(options.pop("worker_threads", self.concurrency()))
        self.broker = RedisBroker(client=self._client(), namespace=self.ns, **options)
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

    def _user_actor(self) -> None:
        """The user's broker, pointed at the run's server in the run's namespace, and their actor."""
        spec, task = self.settings.app, self.settings.task
        if not spec:
            raise UsageError("dramatiq runs your actor on your broker: give --app module:broker (or module)")
        if ":" in spec:
            found = user.importable(spec, "app")
            broker = found.broker if isinstance(found, dramatiq.Actor) else found
        else:  # a module whose actors are declared on the global broker
            user.import_module(spec, "app")
            broker = dramatiq.get_broker()
        if not isinstance(broker, dramatiq.Broker):
            raise UsageError(f"app {spec} is a {type(broker).__name__}, not a Dramatiq broker (give module:broker)")
        if not isinstance(broker, RedisBroker):
            raise UsageError(
                f"app {spec} hard-codes another broker ({type(broker).__name__}): crashbench tests it on Redis only"
            )
        try:
            self.actor = broker.get_actor(task)
        except ActorNotFound:
            names = ", ".join(sorted(broker.get_declared_actors())) or "none"
            raise UsageError(f"app {spec} has no actor {task!r}", hint=f"its actors: {names}") from None
        options = dict(self.settings.options)  # [library.<design>]: the worker's threads only
        self.threads = int(options.pop("worker_threads", self.concurrency()))
        if options:
            raise UsageError(f"[library.{self.name}] {', '.join(options)}: with --app, set them on your own broker")
        broker.client = self._client()
        broker.scripts = {name: broker.client.register_script(s.script) for name, s in broker.scripts.items()}
        broker.namespace = self.ns
        # A process's own id, as the dramatiq command's processes each import the app afresh: a worker
        # forked from the harness would otherwise heartbeat for every other, and a dead one's never expire.
        broker.broker_id = str(uuid.uuid4())
        self.broker, self.queue = broker, self.actor.queue_name

    def _client(self) -> redis.Redis:
        """The broker's client of the run's server. Dramatiq has no Sentinel support of its own: on a Sentinel
        topology (a worker's, under sentinel-kill), redis-py's Sentinel client, which RedisBroker takes."""
        parts = sentinels.topology(self.r)
        if parts is not None:
            return sentinels.master(parts)
        return redis.Redis(connection_pool=redis.ConnectionPool.from_url(self.url()))

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
        if not self.settings.task:
            for job in jobs:  # a delayed job: send_with_options(delay=ms), into the delay queue Q.DQ
                self.actor.send_with_options(args=(job.id,), delay=round(job.delay_s * 1000) or None)
            return
        for job in jobs:  # as actor.send_with_options, with crashbench's id as the message's
            args, kwargs = user.arguments(job)
            message = Message(
                queue_name=self.actor.queue_name, actor_name=self.actor.actor_name, args=tuple(args), kwargs=kwargs,
                options={}, message_id=job.id,
            )  # fmt: skip
            self.broker.enqueue(message, delay=round(job.delay_s * 1000) or None)

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # what the dramatiq command does on SIGTERM
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        if self.settings.task:  # the ledger of the user's actor, from Dramatiq's own middleware hooks
            self.broker.add_middleware(Ledger())
        w = dramatiq.Worker(self.broker, worker_threads=self.threads)
        w.start()
        ready()
        while not stop.wait(0.1):
            pass
        w.stop()

    def backlog(self) -> int:
        # One MULTI: a message moving from the delay queue to the queue between two reads would be in neither.
        pipe = self.r.pipeline(transaction=True).hlen(f"{self.ns}:{self.queue}.msgs")
        return sum(pipe.hlen(f"{self.ns}:{self.queue}.DQ.msgs").execute())

    def _jobs(self, key: str) -> dict[str, str]:
        """message id -> job id, for a messages hash."""
        found = {mid: _message_job(raw, bool(self.settings.task)) for mid, raw in self.r.hgetall(key).items()}
        return {mid: job for mid, job in found.items() if job is not None}

    def state(self) -> QueueState:
        q = f"{self.ns}:{self.queue}"
        waiting = set(self.r.lrange(q, 0, -1))
        held: dict[str, str] = {}
        for mid, job in self._jobs(f"{q}.msgs").items():
            held[job] = "queue" if mid in waiting else "acks"
        held |= dict.fromkeys(self._jobs(f"{q}.DQ.msgs").values(), "delayed")
        dead = set(self._jobs(f"{q}.XQ.msgs").values())
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
        acked, app = self._acked(snapshot), bool(self.settings.task)
        for queue, kind in ((self.queue, "held"), (f"{self.queue}.DQ", "delayed")):
            listed = snapshot.keys.get(self.key(queue))
            waiting = Counter(listed.items if listed is not None else ())
            bodies = snapshot.keys.get(self.key(f"{queue}.msgs"))
            for mid, raw in bodies.fields.items() if bodies is not None else ():
                if (job := _message_job(raw, app)) is None:
                    continue
                places = ["queue"] * waiting[mid] + [f"acks:{w}" for w in acked.get(queue, {}).get(mid, [])]
                if not places:
                    found.add(job, "msgs-only")  # not delayed either: no worker will ever fetch it
                for where in places:
                    found.add(job, where if kind == "held" else f"delayed:{where}", kind)
        dead = snapshot.keys.get(self.key(f"{self.queue}.XQ.msgs"))
        for raw in dead.fields.values() if dead is not None else ():
            if (job := _message_job(raw, app)) is not None:
                found.add(job, "XQ", "dead")
        return found


class DramatiqReliable(DramatiqQueue):
    name = "dramatiq:reliable"
    summary = "Dramatiq 2.x with heartbeat_timeout above the longest job and maintenance on every command"
    reliable = True
