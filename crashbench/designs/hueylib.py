"""huey: huey (3.x) with Redis storage and its own consumer (one worker thread per slot, huey's
shipped default; queue.concurrency changes it).

Keys: huey's own layout, outside crashbench's namespace (so huey refuses --redis-url), with
name = the run prefix made alphanumeric (N):
    huey.redis.N        list of pickled task messages waiting (a sorted set with PriorityRedisHuey)
    huey.schedule.N     sorted set of tasks waiting for their eta (retries with a delay, scheduled tasks)
    huey.results.N      results (switched off here; an [app]'s as it configured them)
    huey.counters.N, huey.notify.N.*    counters and result notifications (unused here)

Each list / sorted-set member is the whole message, so whatever holds one holds the job.

huey pops a message off the list (RPOP) and runs it: nothing in Redis remembers a task a worker
holds, so a worker killed while running it loses it (at-most-once), like the naive design. huey has
no acknowledgement setting for Redis storage. SIGTERM is a hard stop (coleifer/huey#796): the consumer
stops at once and emits SIGNAL_INTERRUPTED for each task still running, which `huey:requeue` answers
with huey's documented recipe, enqueueing the task again (a SIGKILL emits nothing: still lost).

With an [app] (crashbench.designs.app), `--app module:huey` names the user's huey instance (a
RedisHuey, PriorityRedisHuey, ...; another storage, memory, SQLite, files, is refused) and `--task` a
task of its registry (the function's name, or its module.name). The instance runs as the user made it
(serializer, results, the task's retries, timeout, ...), with only its storage rebuilt on the run's
server under the name N (the storage's own settings kept, its connection dropped). A job is one task
whose id is crashbench's job id (huey's Task(id=...)), enqueued by huey.enqueue with the job's payload.
The ledger comes from huey's signals, in the consumer thread that runs the task: executing starts a
job, complete ends it, error (and timeout, locked, canceled, rate-limited, interrupted, retrying)
fails it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import redis
from huey import RedisHuey, signals
from huey.api import Huey
from huey.storage import RedisPriorityQueue, RedisStorage
from huey.utils import normalize_time

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.model.stored import Snapshot

# huey's signals after SIGNAL_EXECUTING that end an attempt without success (the first one counts).
FAILED_SIGNALS = (
    signals.SIGNAL_ERROR, signals.SIGNAL_TIMEOUT, signals.SIGNAL_LOCKED, signals.SIGNAL_CANCELED,
    signals.SIGNAL_RATE_LIMITED, signals.SIGNAL_INTERRUPTED, signals.SIGNAL_RETRYING,
)  # fmt: skip
# A Redis storage's arguments that say where its server is: replaced by the run's.
CONNECTION = {"name", "url", "connection_pool", "client_name", "clean_name"}


def storage_settings(huey: Huey) -> dict[str, Any]:
    """The storage arguments of a huey instance that are its own settings (blocking, read_timeout,
    notify_result, expire_time, ...), not where its server is (url, host, port, a pool, ...)."""
    named: set[str] = set()
    for cls in type(huey.storage).__mro__:
        if "__init__" in vars(cls):
            params = inspect.signature(vars(cls)["__init__"]).parameters.values()
            named |= {p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD}
    return {k: v for k, v in huey.storage_kwargs.items() if k in named - CONNECTION - {"self"}}


class HueyQueue(LibraryDesign):
    name = "huey"
    summary = "huey, Redis storage, as installed: RPOP of the task, at-most-once like naive"
    library = "huey"
    namespaced = False
    runs_apps = True
    drops_failed = True  # no retries configured: huey logs a task that raised and forgets it
    # task.schedule(delay=): the message goes to the queue with its eta; a worker RPOPs it and adds it to
    delays = True  # huey.schedule.N, which the consumer's scheduler reads every second, enqueueing what is due
    requeue_interrupted: ClassVar[bool] = False

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        if settings.task:
            self.huey, self.task = self._user_huey()
            return
        # The scenario's [library.<design>]: RedisHuey arguments.
        self.huey = RedisHuey(name=prefix, **self._server(), **{"results": False, **settings.options})
        self.task = self.huey.task(name="crashbench_handle")(handle)

    def _user_huey(self) -> tuple[Huey, Any]:
        """The user's huey instance, its storage rebuilt on the run's server under the run's name, and
        the task class of their task."""
        spec, task = self.settings.app, self.settings.task
        if not spec:
            raise UsageError("huey runs your task on your huey instance: give --app module:huey")
        huey = user.importable(spec, "app")
        if not isinstance(huey, Huey):
            raise UsageError(f"app {spec} is a {type(huey).__name__}, not a huey instance (huey.Huey)")
        if huey.immediate or not isinstance(huey.storage, RedisStorage):
            kind = "immediate mode" if huey.immediate else f"{type(huey.storage).__name__}"
            raise UsageError(f"app {spec} hard-codes another storage ({kind}): crashbench tests huey on Redis only")
        if self.settings.options:
            raise UsageError(
                f"[library.{self.name}] {', '.join(self.settings.options)}: with --app, set them on your huey"
            )
        registry: dict[str, Any] = huey._registry._registry  # huey's task registry: "module.name" -> task class
        found = [cls for key, cls in registry.items() if task in (key, cls.__name__)]
        if len(found) != 1:
            names = ", ".join(sorted(cls.__name__ for cls in registry.values())) or "none"
            what = "no task" if not found else "more than one task named"
            raise UsageError(f"app {spec} has {what} {task!r}", hint=f"its tasks: {names} (or give module.name)")
        huey.name = self.prefix
        huey.storage = huey.get_storage(**storage_settings(huey), **self._server())
        return huey, found[0]

    def _server(self) -> dict[str, Any]:
        """Where huey's Redis storage connects: the run's URL. huey has no Sentinel support of its own: on a
        Sentinel topology (a worker's, under sentinel-kill), redis-py's Sentinel pool (connection_pool=)."""
        parts = sentinels.topology(self.r)
        return {"url": self.url()} if parts is None else {"connection_pool": sentinels.master(parts).connection_pool}

    def enqueue(self, jobs: Sequence[Job]) -> None:
        if not self.settings.task:
            for job in jobs:  # a delayed job: task.schedule(delay=), into huey.schedule.N until its eta
                self.task.schedule(args=(job.id,), delay=job.delay_s) if job.delay_s else self.task(job.id)
            return
        for job in jobs:  # as calling the task (task.schedule with a delay), with crashbench's id as the task's
            args, kwargs = user.arguments(job)
            eta = normalize_time(delay=job.delay_s, utc=self.huey.utc) if job.delay_s else None
            self.huey.enqueue(self.task(tuple(args), kwargs, id=job.id, eta=eta))

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        self.huey.on_startup()(ready)  # runs in the worker thread, as it starts taking tasks
        if self.settings.task:
            self._ledger()
        if self.requeue_interrupted:  # huey's documented recipe: put an interrupted task back
            self.huey.signal(signals.SIGNAL_INTERRUPTED)(lambda signal, task, *_: self.huey.enqueue(task))
        self.huey.create_consumer(workers=self.concurrency(), worker_type="thread", check_worker_health=False).run()

    def _ledger(self) -> None:
        """The ledger of the user's task, from huey's signals (emitted in the thread that runs the task)."""
        running: set[str] = set()  # started here, not yet ended or failed: an attempt's first end counts

        def executing(signal: str, task: Any, *_: Any) -> None:
            running.add(task.id)
            user.started(task.id)

        def settled(signal: str, task: Any, *_: Any) -> None:
            if task.id in running:
                running.discard(task.id)
                (user.ended if signal == signals.SIGNAL_COMPLETE else user.failed)(task.id)

        self.huey.signal(signals.SIGNAL_EXECUTING)(executing)
        self.huey.signal(signals.SIGNAL_COMPLETE, *FAILED_SIGNALS)(settled)

    def configuration(self) -> dict[str, Any]:
        requeue = self.requeue_interrupted
        return {"concurrency": self.concurrency(), "ack": "none (RPOP)", "requeue_interrupted": requeue}

    def backlog(self) -> int:
        # One MULTI on huey's own keys: a task the scheduler moves into the queue between two reads
        # (huey's pending_count, then scheduled_count) would be in neither.
        # (PriorityRedisHuey's queue is a sorted set.)
        storage = self.huey.storage
        pipe = storage.conn.pipeline(transaction=True)
        (pipe.zcard if isinstance(storage, RedisPriorityQueue) else pipe.llen)(storage.queue_key)
        return sum(pipe.zcard(storage.schedule_key).execute())

    def _job(self, task: Any) -> str | None:
        """The job a huey task (or its Message) is: its first argument, with an [app] its id."""
        if self.settings.task:
            return task.id if isinstance(task.id, str) and user.ours(task.id) else None
        args = task.args
        return args[0] if isinstance(args, tuple | list) and args and isinstance(args[0], str) else None

    def state(self) -> QueueState:
        held = {job: "queue" for t in self.huey.pending() if (job := self._job(t)) is not None}
        held |= {job: "schedule" for t in self.huey.scheduled() if (job := self._job(t)) is not None}
        return QueueState(held=held)

    def key_patterns(self) -> list[str]:
        # huey's keys are named after the cleaned name alone ([A-Za-z0-9_], no glob characters).
        storage = self.huey.storage
        keys = [storage.queue_key, storage.schedule_key, storage.result_key, storage.counter_key]
        return [*keys, storage.notify_prefix + "*"]

    def _message_job(self, raw: bytes) -> str | None:
        """The job id of a stored message: huey's serializer (pickle) gives its Message tuple."""
        try:
            message = self.huey.serializer.deserialize(raw)
            return self._job(message)
        except Exception:  # whatever unpickling fails with, it is not one of our messages
            return None

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        storage = self.huey.storage
        for key, where, kind in ((storage.queue_key, "queue", "held"), (storage.schedule_key, "schedule", "delayed")):
            stored = snapshot.keys.get(key)
            for raw in stored.items if stored is not None else ():
                if (job := self._message_job(raw)) is not None:
                    found.add(job, where, kind)
        return found


class HueyRequeue(HueyQueue):
    name = "huey:requeue"
    summary = "huey with its recipe for interrupted tasks: a SIGTERM's hard stop puts the running task back"
    requeue_interrupted = True
