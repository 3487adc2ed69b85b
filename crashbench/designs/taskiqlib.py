"""taskiq, taskiq:stream and taskiq:reliable: taskiq 0.13 on taskiq-redis 1.2, with taskiq's own Receiver.

Keys (all under the run prefix P, so these designs also run on --redis-url):
    P queue     taskiq: ListQueueBroker's list of messages (LPUSH by the producer, BRPOP by a worker)
    P stream    taskiq:stream / taskiq:reliable: RedisStreamBroker's stream, one entry per message
                ({data: message}); consumer group "P workers", one consumer (a uuid) per worker process
A message is taskiq's JSON (TaskiqMessage: task_id, task_name, labels, args, kwargs); the job id is
args[0]. A stream holds a job while its entry is undelivered to the group or pending (in the PEL).
The stream broker's XAUTOCLAIM also SETs and DELetes a lock "autoclaim:<group>:<stream>", but both
inside the same MULTI/EXEC as the claim, so that key never exists for another client to see.

Each slot runs taskiq's Receiver in-process, as `taskiq worker` runs it in each process it spawns:
max_async_tasks 100, and the sync handler in a ThreadPoolExecutor of Python's default size
(min(32, cpus + 4)), so min(those) handlers run at once; queue.concurrency sets both. SIGTERM and
SIGINT set the Receiver's finish event, as the CLI's handlers do; running tasks then finish.

    taskiq           ListQueueBroker as installed: BRPOP takes the message, nothing acknowledges it;
                     a killed worker loses every message it had popped, running or waiting for a
                     thread (the Receiver takes up to max_async_tasks ahead): at-most-once. Its BRPOP
                     has no timeout but redis-py 8 reads with a 5 s socket_timeout, which listen()
                     does not catch: a worker idle for 5 s exits (taskiq-redis #127); `taskiq
                     worker` restarts it, as crashbench's supervisor does.
    taskiq:stream    RedisStreamBroker as installed: XREADGROUP 100 entries at a time, XACK when the
                     task is done (the Receiver's default ack_type WHEN_SAVED: after the result is
                     saved, with no result backend right after the task); XAUTOCLAIM of entries idle
                     idle_timeout = 10 min, so a job longer than that runs twice at once.
    taskiq:reliable  idle_timeout = job_timeout() (above the longest job), xread_count 1.

An entry is idle from its delivery to its XACK, waiting for a thread included: with 100 tasks on
fewer threads a worker's own prefetched entries can go idle too (config_warnings says when).
The claim runs only after an XREADGROUP that returned new entries, once per xread_count of them:
on a stream whose every entry was read, nothing is claimed however long a dead worker's entries
wait, until a producer adds work. xread_count 1 makes a pass per message while there are any;
no setting makes one run on an idle stream. A task that raised is acked and forgotten.

[library."<design>"] entries go to taskiq's Receiver when they are its arguments (max_async_tasks,
max_prefetch, ack_type, ...), to the thread pool as max_threadpool_threads, else to the broker.

On a Redis Cluster each design takes taskiq-redis's own cluster broker, as its documentation tells a
cluster's users to (the keys above are in the run's hash-tag slot, so a stream and its group share a
node): ListQueueClusterBroker for taskiq, RedisStreamClusterBroker for the stream designs. The cluster
stream broker has no claim at all (no XAUTOCLAIM, no idle_timeout or xread_count; XREADGROUP without
COUNT, so a worker takes every entry there is), so a dead worker's entries stay pending for good; and
taskiq:reliable's settings are refused by it, which is that design's answer on a cluster.

On a Sentinel topology (a worker's under sentinel-kill: crashbench.designs.sentinels) each design takes
taskiq-redis's own Sentinel broker: ListQueueSentinelBroker for taskiq, RedisStreamSentinelBroker for
taskiq:stream, given RedisStreamBroker's xread_block (2 s: its own 10 s outlasts redis-py 8's 5 s read
timeout, so an idle worker would exit every 10 s). That broker has no claim at all (no XAUTOCLAIM, no
idle_timeout or xread_count): a dead worker's entries, and those whose XACK the dead primary took with it,
stay pending for good; taskiq:reliable's settings do not exist there, and it is refused under sentinel-kill.
App mode on Sentinel hands the user's broker a redis.asyncio Sentinel pool.

App mode ([app]: crashbench.designs.app): `--app module:broker`, the user's taskiq-redis broker (a
ListQueueBroker under --design taskiq, a RedisStreamBroker under taskiq:stream or taskiq:reliable),
and `--task NAME`, a task registered in it. The broker itself is kept (its class, options, tasks,
middlewares, serializer): only its connection pool is made again on the run's URL (the user's pool
options kept) and its queue, and a stream's group, set to the keys above. A broker of another kind
(InMemoryBroker, PubSubBroker, a cluster's) is refused, and so is a result backend, whose keys would
live outside the run's namespace. Each job is enqueued as the user's code would:
task.kicker().with_task_id(<id>).kiq(*args, **kwargs), so the message's task_id is crashbench's id
(read from it, not from args, above). The ledger is a TaskiqMiddleware added in each worker:
pre_execute a start, post_execute an end, or a failed attempt when the result is an error. Under
taskiq:reliable the user's broker options stay (its idle_timeout, xread_count): ours do not apply.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import redis
from taskiq import AsyncBroker, TaskiqEvents, TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.acks import AcknowledgeType
from taskiq.cli.worker.run import shutdown_broker
from taskiq.receiver import Receiver
from taskiq_redis import (
    ListQueueBroker,
    ListQueueClusterBroker,
    ListQueueSentinelBroker,
    RedisStreamBroker,
    RedisStreamClusterBroker,
    RedisStreamSentinelBroker,
)

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.model.stored import Snapshot

TASK = "crashbench_handle"
SHUTDOWN_TIMEOUT = 5.0  # taskiq worker --shutdown-timeout default, seconds
MAX_ASYNC_TASKS = 100  # taskiq worker --max-async-tasks default
IDLE_TIMEOUT_MS = 600_000  # RedisStreamBroker's idle_timeout default
XREAD_BLOCK_MS = 2000  # RedisStreamBroker's xread_block default: the longest wait between two reads
RECEIVER_ARGS = frozenset(inspect.signature(Receiver.__init__).parameters) - {"self", "broker", "executor"}
# A connection pool's keywords that say where the server is: the run's URL gives them (app mode).
ADDRESS = frozenset({"host", "port", "db", "username", "password", "path", "connection_class", "credential_provider"})


def crashbench_handle(job_id: str) -> None:
    # Sync, so taskiq runs it in its thread pool: the ledger pairs each start with its end per thread.
    # taskiq keeps no delivery count it would pass on (no retry middleware): every run is attempt 1.
    handle(job_id, attempt=1)


def _message_job(raw: bytes | str | None, by_task_id: bool = False) -> str | None:
    """The job id a stored taskiq message carries (its first argument; app mode: its task_id), or None."""
    try:
        message = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    if by_task_id:
        return message["task_id"] if isinstance(message.get("task_id"), str) else None
    args = message.get("args")
    return args[0] if isinstance(args, list) and args and isinstance(args[0], str) else None


class LedgerMiddleware(TaskiqMiddleware):
    """App mode: the ledger from taskiq's own middleware hooks, on the worker's event loop."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts = user.Contexts()

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        self.contexts.started(message.task_id)
        return message

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        self.contexts.ended(message.task_id, not result.is_err)


class TaskiqList(LibraryDesign):
    name = "taskiq"
    summary = "taskiq, taskiq-redis ListQueueBroker as installed: BRPOP, no ack, at-most-once"
    library = "taskiq_redis"
    cluster_client = True  # taskiq-redis's cluster brokers
    no_delays = (
        "taskiq-redis's brokers have no delay of their own; taskiq delays a task only as a schedule "
        "(kicker().schedule_by_time on a schedule source) that a separate `taskiq scheduler` process sends"
    )
    DEFAULT_CONCURRENCY = MAX_ASYNC_TASKS
    drops_failed = True  # no retry middleware: a task that raised is logged and its message is gone
    runs_apps = True
    BROKER: ClassVar[type[AsyncBroker]] = ListQueueBroker  # the user's broker's class in app mode

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.queue = self.key("queue")
        options = settings.options
        self.receiver_options = {k: v for k, v in options.items() if k in RECEIVER_ARGS}
        self.broker_options = {k: v for k, v in options.items() if k not in RECEIVER_ARGS}
        self.threads: int | None = self.broker_options.pop("max_threadpool_threads", settings.concurrency or None)
        self.app_broker = self._user_broker() if settings.task else None

    def _user_broker(self) -> Any:
        """The user's broker, checked: a taskiq-redis broker of this design's kind, with the task."""
        spec, broker = self.settings.app, user.importable(self.settings.app, "app")
        kind = type(broker).__name__
        if not isinstance(broker, AsyncBroker):
            raise UsageError(f"app {spec} is a {kind}, not a taskiq broker")
        if not isinstance(broker, (ListQueueBroker, RedisStreamBroker)):
            raise UsageError(f"app {spec} is a {kind}: crashbench tests taskiq on Redis, with a taskiq-redis "
                             "ListQueueBroker or RedisStreamBroker")  # fmt: skip
        if not isinstance(broker, self.BROKER):
            right = "taskiq" if isinstance(broker, ListQueueBroker) else "taskiq:stream (or taskiq:reliable)"
            raise UsageError(f"app {spec} is a {kind}, not what {self.name} runs", hint=f"give --design {right}")
        if (backend := type(broker.result_backend).__name__) != "DummyResultBackend":
            raise UsageError(f"app {spec} has a result backend ({backend}): crashbench runs a taskiq app "
                             "without one (its keys would be outside the run's namespace)")  # fmt: skip
        if self.on_cluster():
            raise UsageError(f"{self.name} runs your app on one server, not on a cluster")
        if broker.find_task(self.settings.task) is None:
            names = ", ".join(sorted(broker.get_all_tasks())) or "none"
            raise UsageError(f"app {spec} has no task {self.settings.task!r}", hint=f"its tasks: {names}")
        return broker

    def point(self, broker: Any) -> None:
        """App mode: the user's broker on the run's server and keys (a new pool: one per event loop)."""
        pool = broker.connection_pool
        kept = {k: v for k, v in pool.connection_kwargs.items() if k not in ADDRESS and not k.startswith("ssl")}
        if (parts := sentinels.topology(self.r)) is not None:  # a Sentinel pool (redis.asyncio's) for its class
            broker.connection_pool = sentinels.async_master(parts).connection_pool
        else:
            broker.connection_pool = type(pool).from_url(self.url(), max_connections=pool.max_connections, **kept)
        broker.queue_name = self.queue

    def sentinel_options(self) -> dict[str, Any] | None:
        """On a Sentinel topology (a worker's, under sentinel-kill), the arguments of taskiq-redis's own
        Sentinel brokers (the sentinels, the master's name, the database and password); else None."""
        if (parts := sentinels.topology(self.r)) is None:
            return None
        return {"sentinels": list(parts.sentinels), "master_name": parts.master, "db": parts.db,
                "password": parts.password}  # fmt: skip

    def make_broker(self) -> AsyncBroker:
        if (on_sentinel := self.sentinel_options()) is not None:
            return ListQueueSentinelBroker(**on_sentinel, queue_name=self.queue, **self.broker_options)
        cls = ListQueueClusterBroker if self.on_cluster() else ListQueueBroker
        return cls(url=self.url(), queue_name=self.queue, **self.broker_options)

    def _broker(self) -> AsyncBroker:
        if self.app_broker is not None:
            self.point(self.app_broker)
            return self.app_broker
        broker = self.make_broker()
        broker.register_task(crashbench_handle, task_name=TASK)  # what @broker.task does
        return broker

    def handlers(self) -> tuple[int, int]:
        """(max_async_tasks, thread pool size): a sync task runs once it holds both."""
        tasks = self.receiver_options.get("max_async_tasks", self.concurrency())
        return tasks, self.threads or min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default (3.8-3.12)

    def configuration(self) -> dict[str, Any]:
        tasks, threads = self.handlers()
        # "concurrency": the handlers running at once (LibraryDesign.configuration's key).
        return {"max_async_tasks": tasks, "threads": threads, "concurrency": min(tasks, threads), "ack": "none (BRPOP)"}

    def enqueue(self, jobs: Sequence[Job]) -> None:
        asyncio.run(self._kick(jobs))

    async def _kick(self, jobs: Sequence[Job]) -> None:
        # As a taskiq producer does: startup (the stream broker creates its group there), kiq, shutdown.
        # A broker (app mode: a pool) per call: its connection pool belongs to this call's event loop.
        broker = self._broker()
        await broker.startup()
        try:
            task = broker.find_task(self.settings.task or TASK)
            assert task is not None
            for job in jobs:
                if self.app_broker is None:
                    await task.kiq(job.id)
                    continue
                args, kwargs = user.arguments(job)
                await task.kicker().with_task_id(job.id).kiq(*args, **kwargs)
        finally:
            await broker.shutdown()

    def _job(self, raw: bytes | str | None) -> str | None:
        return _message_job(raw, by_task_id=self.app_broker is not None)

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        # What taskiq.cli.worker.run.start_listen does in each worker process, without its spawner.
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        finish = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Only sets the event, as the CLI's handler does; through the loop, so that a worker
            # blocked in BRPOP (no timeout) wakes for it.
            loop.add_signal_handler(sig, finish.set)
        broker = self._broker()
        broker.is_worker_process = True
        broker.add_event_handler(TaskiqEvents.WORKER_STARTUP, lambda _state: ready())
        if self.app_broker is not None:
            broker.add_middlewares(LedgerMiddleware())
            if isinstance(broker, RedisStreamBroker):  # a consumer per process, as each `taskiq worker` one draws
                broker.consumer_name = str(uuid.uuid4())
        options = {"max_async_tasks": self.concurrency(), **self.receiver_options}
        try:
            with ThreadPoolExecutor(max_workers=self.threads) as pool:
                receiver = Receiver(broker=broker, executor=pool, **options)
                try:
                    loop.run_until_complete(receiver.listen(finish))
                finally:
                    loop.run_until_complete(shutdown_broker(broker, SHUTDOWN_TIMEOUT))
        finally:
            loop.close()

    def backlog(self) -> int:
        return int(self.r.llen(self.queue))

    def state(self) -> QueueState:
        held = {job: "queue" for raw in self.r.lrange(self.queue, 0, -1) if (job := self._job(raw))}
        return QueueState(held=held)

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        listed = snapshot.keys.get(self.queue)
        for raw in listed.items if listed is not None and listed.type == "list" else ():
            if (job := self._job(raw)) is not None:
                found.add(job, "queue")
        return found


class TaskiqStream(TaskiqList):
    name = "taskiq:stream"
    summary = "taskiq, RedisStreamBroker as installed: ack after the task, XAUTOCLAIM after 10 min idle"
    reliable: ClassVar[bool] = False
    BROKER = RedisStreamBroker

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.stream = self.key("stream")
        self.group = self.key("workers")
        if (b := self.app_broker) is not None:  # the user's broker's own settings
            self.broker_options = {"idle_timeout": b.idle_timeout, "xread_count": b.count, "xread_block": b.block}
        elif self.reliable:
            # The reclaim delay above the longest job (the base class sizes it), and a claim pass
            # after every message read rather than every 100.
            self.broker_options = {"idle_timeout": math.ceil(self.job_timeout() * 1000), "xread_count": 1,
                                   **self.broker_options}  # fmt: skip

    def make_broker(self) -> AsyncBroker:
        if (on_sentinel := self.sentinel_options()) is not None:  # no claim there (module docstring)
            options = {**on_sentinel, "queue_name": self.stream, "consumer_group_name": self.group}
            return RedisStreamSentinelBroker(**options, **{"xread_block": XREAD_BLOCK_MS, **self.broker_options})
        cls = RedisStreamClusterBroker if self.on_cluster() else RedisStreamBroker
        return cls(url=self.url(), queue_name=self.stream, consumer_group_name=self.group, **self.broker_options)

    def point(self, broker: Any) -> None:
        super().point(broker)
        broker.queue_name, broker.consumer_group_name = self.stream, self.group

    def idle_timeout(self) -> float:
        """Seconds an entry stays pending before another worker's XAUTOCLAIM takes it."""
        return self.broker_options.get("idle_timeout", IDLE_TIMEOUT_MS) / 1000

    def redelivery_s(self) -> float | None:
        if self.on_cluster():
            return None  # the cluster broker never claims a dead worker's entries
        # Idle for idle_timeout, then claimed by the next pass, which follows a read that returned
        # entries: at most one xread_block later while the stream has unread entries.
        return self.idle_timeout() + self.broker_options.get("xread_block", XREAD_BLOCK_MS) / 1000

    def configuration(self) -> dict[str, Any]:
        ack = AcknowledgeType(self.receiver_options.get("ack_type", AcknowledgeType.WHEN_SAVED)).value
        if self.on_cluster():
            return super().configuration() | {"ack": f"XACK {ack} (ack_type)", "autoclaim": "none (cluster broker)"}
        return super().configuration() | {
            "ack": f"XACK {ack} (ack_type)",
            "idle_timeout_s": self.idle_timeout(),
            "xread_count": self.broker_options.get("xread_count", 100),
            "autoclaim": "after each XREADGROUP that returned entries",
        }

    def config_warnings(self) -> list[str]:
        if self.on_cluster():
            return []  # nothing is claimed there, so nothing runs twice
        idle, (tasks, threads) = self.idle_timeout(), self.handlers()
        twice = "claimed by another worker while it still runs, it runs twice"
        if warnings := self.library_timeout_warning("idle_timeout", idle, "a job is " + twice):
            return warnings
        # Idle from delivery to ack: a message the Receiver took waits for a thread behind the others.
        if (waited := math.ceil(tasks / threads) * self.settings.longest_job) >= idle:
            return [f"{self.name}: max_async_tasks {tasks} on {threads} threads: a message taken ahead can wait "
                    f"up to {waited:g} s for its ack, not below idle_timeout {idle:g} s: " + twice]  # fmt: skip
        return []

    def _group(self) -> dict[str, Any] | None:
        groups = self.r.xinfo_groups(self.stream) if self.r.exists(self.stream) else []
        return next((g for g in groups if g["name"] == self.group), None)

    def backlog(self) -> int:
        if (group := self._group()) is None:
            return int(self.r.xlen(self.stream))
        lag = group.get("lag")
        if lag is None:  # Redis cannot tell after a deletion: count what follows last-delivered-id
            lag = len(self.r.xrange(self.stream, "(" + group["last-delivered-id"], "+"))
        return int(group["pending"] + lag)

    def state(self) -> QueueState:
        group = self._group()
        start = "-" if group is None else "(" + group["last-delivered-id"]
        places = [("stream", fields) for _, fields in self.r.xrange(self.stream, start, "+")]  # undelivered
        for p in self.r.xpending_range(self.stream, self.group, "-", "+", 1_000_000) if group else ():
            eid = p["message_id"]
            places += [(f"pel:{p['consumer']}", fields) for _, fields in self.r.xrange(self.stream, eid, eid)]
        return QueueState(held={job: where for where, fields in places if (job := self._job(fields.get("data")))})

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        stream = snapshot.keys.get(self.stream)
        for where, _, fields in stream.stream_places() if stream is not None and stream.type == "stream" else ():
            if fields is not None and (job := self._job(fields.get(b"data"))) is not None:
                found.add(job, where or "stream")  # "pel:<consumer>" once delivered, until acked
        return found

    def key_patterns(self) -> list[str]:
        # The claim lock lives only inside a MULTI/EXEC; matched all the same should a version keep it.
        return [self.prefix + "*", f"autoclaim:{self.group}:*"]


class TaskiqReliable(TaskiqStream):
    name = "taskiq:reliable"
    summary = "taskiq, RedisStreamBroker with idle_timeout above the longest job and a claim pass per message"
    reliable = True
    no_sentinel = (
        "taskiq-redis's RedisStreamSentinelBroker has no claim (no XAUTOCLAIM, no idle_timeout or xread_count): "
        "this configuration does not exist on Sentinel; taskiq:stream runs that broker as shipped"
    )
