"""celery and celery:acks-late: Celery 5.x on its Redis broker (kombu), with Celery's own worker.

Keys (all under the run prefix P, through kombu's `global_keyprefix` transport option):
    P jobs                  list of task messages waiting (JSON; the task id in headers.id)
    P unacked               hash delivery tag -> [message, exchange, routing key]: delivered, not acked
    P unacked_index         sorted set delivery tag -> delivery time, for the visibility timeout
                            (a delayed task, countdown / eta, waits here, "unacked:eta": the worker that
                            took it holds it in memory until its eta; the sweep restores it every
                            visibility_timeout meanwhile, to be taken again: kombu#337)
    P unacked_mutex         the restore sweep's lock
    P _kombu.binding.jobs   kombu's routing table
    P jobs<sep><n>          the list for priority n > 0 (kombu's priority steps; no task here sets one)

A message is its own body (the list entry, the unacked value), so whatever holds one holds the job. A
delivery tag in unacked_index without its unacked entry holds nothing; an unacked entry without its
index entry is a job the visibility sweep never restores ("unacked:unindexed").

Each worker slot runs `app.Worker` with the prefork pool at Celery's shipped concurrency (one pool
child per CPU; queue.concurrency or the `worker_concurrency` setting changes it): the task runs in a
pool child process, so faults go to the worker's whole process tree.

kombu gives back a message delivered more than visibility_timeout ago in a restore sweep that scans
Redis on every unacked_restore_throttle-th tick of a timer firing every unacked_restore_interval
seconds (10 x 10 s as installed): a message comes back up to visibility + interval x throttle later.

    celery           as installed: the task is acked when it starts (early ack), prefetch x4, a
                     visibility timeout of one hour: a task killed while running is gone; messages the
                     worker had prefetched wait in `unacked` for an hour
    celery:acks-late per Celery's documentation for tasks that must survive a worker crash:
                     task_acks_late + task_reject_on_worker_lost, prefetch x1, visibility_timeout
                     above the longest job (LibraryDesign.job_timeout: 1 s for the default 10 ms
                     jobs), and the restore sweep every second (interval 1, throttle 1)
    celery:threads   celery:acks-late on the threads pool (tasks in threads of the worker process)
    celery:gevent    celery:acks-late on the gevent pool (tasks in greenlets of the worker process,
                     which starts in a fresh interpreter that monkey-patches first:
                     crashbench.run.gevent_worker); no event loop, so kombu restores unacked messages
                     from its polls, not from a timer (celery#4976 reports they never come back)
    celery:solo      celery:acks-late on the solo pool (one task, in the worker process itself)

With an [app] (crashbench.designs.app), the user's Celery app runs as the user configured it (acks,
prefetch, pool, visibility timeout), with its broker (and a Redis result backend) pointed at the run's
server and kombu's global_keyprefix set to the run's namespace; every job is sent to its default queue
(task_default_queue, "celery" unless set: P <that queue> above). The ledger comes from Celery's own
task_prerun / task_postrun signals, in the process that runs the task.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import redis
from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_ready

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.model.stored import Snapshot
from crashbench.redact import redact_url

QUEUE = "jobs"
TASK = "crashbench.handle"
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: the list of priority n is <queue><sep><n>


def _task_id(message: Any) -> str | None:
    """The task id in a kombu message (protocol 2: headers.id), or None for anything else."""
    headers = message.get("headers") if isinstance(message, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    return task_id if isinstance(task_id, str) else None


def _eta(message: Any) -> bool:
    """Whether a kombu message is a delayed task (countdown / eta: headers.eta set): a worker holds it
    in memory, unacked in Redis, until its eta."""
    headers = message.get("headers") if isinstance(message, dict) else None
    return isinstance(headers, dict) and bool(headers.get("eta"))


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


class CeleryQueue(LibraryDesign):
    name = "celery"
    summary = "Celery 5.x, Redis broker, as installed: early ack, a task killed while running is lost"
    library = "celery"
    acks_late: ClassVar[bool] = False
    pool: ClassVar[str] = "prefork"  # Celery's worker_pool, as installed; the variants below change it
    runs_apps = True
    # No retries are configured: a task that raised is acked (early, or late: task_acks_on_failure_or_timeout).
    drops_failed = True
    delays = True  # send_task(countdown=): the worker holds the message, unacked, until its eta
    DEFAULT_CONCURRENCY = os.cpu_count() or 1  # Celery's worker_concurrency default: the CPU count

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.queue, self.task = QUEUE, TASK
        if settings.app:
            self.app = self._user_app()
            return
        self.app = Celery("crashbench", broker=self._broker_url(), set_as_current=False)
        self.app.conf.update(self._config())
        self.app.task(name=TASK, ignore_result=True)(handle)

    def _broker_url(self) -> str:
        """The run's server as Celery's broker_url: on a Sentinel topology (a worker's, under sentinel-kill),
        kombu's own `sentinel://` URL, its master's name in the transport options (`_sentinel_options`)."""
        parts = sentinels.topology(self.r)
        return self.url() if parts is None else sentinels.kombu_url(parts)

    def _sentinel_options(self) -> dict[str, Any]:
        """kombu's Sentinel transport option, on a Sentinel topology: the master's name."""
        parts = sentinels.topology(self.r)
        return {} if parts is None else {"master_name": parts.master}

    def _user_app(self) -> Celery:
        """The user's app, pointed at the run's server, in the run's namespace; its own settings kept."""
        spec, app = self.settings.app, user.importable(self.settings.app, "app")
        if not isinstance(app, Celery):
            raise UsageError(f"app {spec} is a {type(app).__name__}, not a Celery app (celery.Celery)")
        broker = str(app.conf.broker_url or "redis://")
        if not broker.startswith(("redis://", "rediss://", "redis+socket://", "sentinel://")):
            raise UsageError(f"app {spec} uses the broker {redact_url(broker)}: crashbench tests it on Redis only")
        if (task := app.tasks.get(self.settings.task)) is None:
            names = sorted(n for n in app.tasks if not n.startswith("celery."))
            raise UsageError(f"app {spec} has no task {self.settings.task!r}", hint=f"its tasks: {', '.join(names)}")
        on_sentinel = self._sentinel_options()
        transport = {**(app.conf.broker_transport_options or {}), "global_keyprefix": self.prefix, **on_sentinel}
        conf = {"broker_url": self._broker_url(), "broker_read_url": None, "broker_write_url": None,
                "broker_transport_options": transport, "worker_hijack_root_logger": False,
                "broker_connection_retry_on_startup": True}  # fmt: skip
        if str(app.conf.result_backend or "").startswith(("redis://", "rediss://", "sentinel://")):
            conf["result_backend"] = self._broker_url()  # Celery's Redis backend takes sentinel:// too
            conf["result_backend_transport_options"] = {**(app.conf.result_backend_transport_options or {}),
                                                        **on_sentinel}  # fmt: skip
        if self.settings.concurrency:
            conf["worker_concurrency"] = self.settings.concurrency
        if app._pool is not None:  # connections of an earlier run in this process (another server) go
            app._pool.force_close_all()
        app._pool, app.amqp._producer_pool = None, None
        app.conf.update(conf)
        self.queue, self.task = app.conf.task_default_queue, task.name
        return app

    def _config(self) -> dict[str, Any]:
        transport: dict[str, Any] = {"global_keyprefix": self.prefix}
        config: dict[str, Any] = {
            "broker_transport_options": transport,
            "task_ignore_result": True,
            "worker_hijack_root_logger": False,
            "broker_connection_retry_on_startup": True,
            "task_default_queue": QUEUE,
        }
        if self.acks_late:
            transport.update(
                visibility_timeout=self.job_timeout(),
                unacked_restore_interval=1,
                unacked_restore_throttle=1,
            )
            config.update(task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1)
        options = dict(self.settings.options)  # the scenario's [library.<design>]: Celery settings
        transport.update(options.pop("broker_transport_options", {}))
        transport["global_keyprefix"] = self.prefix  # crashbench's namespace always wins
        transport.update(self._sentinel_options())  # and the run's master, on a Sentinel topology
        config["worker_concurrency"] = self.concurrency()
        config["worker_pool"] = self.pool
        return {**config, **options}

    def _transport(self, name: str) -> float:
        """A kombu Redis transport option in effect: ours or the scenario's, else kombu's default."""
        defaults = {"visibility_timeout": 3600, "unacked_restore_interval": 10, "unacked_restore_throttle": 10}
        return float(self.app.conf.broker_transport_options.get(name, defaults[name]))

    def redelivery_s(self) -> float:
        sweep = self._transport("unacked_restore_interval") * max(1.0, self._transport("unacked_restore_throttle"))
        return self._transport("visibility_timeout") + sweep

    def configuration(self) -> dict[str, Any]:
        conf = self.app.conf
        return {
            "acks_late": bool(conf.task_acks_late), "pool": str(conf.worker_pool),
            "concurrency": int(conf.worker_concurrency),
            "prefetch_multiplier": int(conf.worker_prefetch_multiplier),
            "visibility_timeout_s": self._transport("visibility_timeout"),
            "restore_sweep_s": self.redelivery_s() - self._transport("visibility_timeout"),
        }  # fmt: skip

    def config_warnings(self) -> list[str]:
        # Early ack never redelivers a running task; with late ack, kombu restores every message
        # delivered longer ago than the visibility timeout, running or not.
        if not self.app.conf.task_acks_late:
            return []
        return self.library_timeout_warning(
            "visibility_timeout", self._transport("visibility_timeout"),
            "kombu gives a task that is still running to another worker, so it runs twice",
        )  # fmt: skip

    def enqueue(self, jobs: Sequence[Job]) -> None:
        with self.app.producer_or_acquire() as producer:
            for job in jobs:
                args, kwargs = user.arguments(job) if self.settings.app else ([job.id], {})
                delay = {"countdown": job.delay_s} if job.delay_s else {}  # Celery's own: eta = now + countdown
                self.app.send_task(
                    self.task, args=args, kwargs=kwargs, task_id=job.id, queue=self.queue, producer=producer, **delay
                )

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        worker_ready.connect(lambda **_: ready(), weak=False)  # consumer started, pool up
        if self.settings.app:  # the ledger from Celery's own signals, in the pool process that runs the task
            task_prerun.connect(lambda task_id="", **_: user.started(task_id), weak=False)
            task_postrun.connect(
                lambda task_id="", state="", **_: (user.ended if state == "SUCCESS" else user.failed)(task_id),
                weak=False,
            )
        self.app.Worker(
            hostname=f"{worker}@crashbench",
            pool=self.app.conf.worker_pool or "prefork",
            concurrency=self.app.conf.worker_concurrency,
            queues=[self.queue],
            loglevel="WARNING",
            without_mingle=True,
            without_gossip=True,
            without_heartbeat=True,
        ).start()

    def backlog(self) -> int:
        # One MULTI: a message restored from unacked to the queue between two reads would be in neither.
        return sum(self.r.pipeline(transaction=True).llen(self.key(self.queue)).hlen(self.key("unacked")).execute())

    def state(self) -> QueueState:
        held = {json.loads(raw)["headers"]["id"]: "queue" for raw in self.r.lrange(self.key(self.queue), 0, -1)}
        for raw in self.r.hvals(self.key("unacked")):
            held[json.loads(raw)[0]["headers"]["id"]] = "unacked"
        return QueueState(held=held)

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        queue = self.key(self.queue)
        for name, stored in snapshot.keys.items():
            if stored.type == "list" and (name == queue or name.startswith(queue + PRIORITY_SEP)):
                for raw in stored.items:
                    if (job := _task_id(_json(raw))) is not None:
                        found.add(job, "queue")
        unacked = snapshot.keys.get(self.key("unacked"))
        index = snapshot.keys.get(self.key("unacked_index"))
        indexed = set(index.items) if index is not None else set()
        for tag, raw in unacked.fields.items() if unacked is not None else ():
            entry = _json(raw)  # [message, exchange, routing key]
            job = _task_id(entry[0]) if isinstance(entry, list) and entry else None
            if job is not None:
                where = "unacked" if tag in indexed else "unacked:unindexed"
                found.add(job, where + (":eta" if _eta(entry[0]) else ""))
        return found


class CeleryAcksLate(CeleryQueue):
    name = "celery:acks-late"
    summary = "Celery 5.x with acks_late + reject_on_worker_lost + a short visibility timeout"
    acks_late = True


class CeleryThreads(CeleryAcksLate):
    name = "celery:threads"
    summary = "celery:acks-late on the threads pool: tasks run in threads of the worker process itself"
    pool = "threads"


class CeleryGevent(CeleryAcksLate):
    name = "celery:gevent"
    summary = "celery:acks-late on the gevent pool: tasks run in greenlets of a monkey-patched worker process"
    pool = "gevent"
    requires = ("gevent",)
    worker_module = "crashbench.run.gevent_worker"  # patches before anything imports socket

    def _user_app(self) -> Celery:
        """The user's app on the gevent pool: its worker is monkey-patched, whatever pool the app names."""
        app = super()._user_app()
        app.conf.worker_pool = self.pool
        return app

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        from gevent import monkey

        if not monkey.is_module_patched("socket"):  # greenlets would block each other: say so, measure nothing
            raise RuntimeError(f"{self.name}: gevent has not patched this process (run it as {self.worker_module})")
        # Patched first thing, as `celery worker -P gevent` does: Celery's warning that the worker_pool
        # setting selects a green pool too late for its patches does not apply.
        warnings.filterwarnings("ignore", message=r"\s*The worker_pool setting shouldn't", category=UserWarning)
        super().serve(worker, ready)


class CelerySolo(CeleryAcksLate):
    name = "celery:solo"
    summary = "celery:acks-late on the solo pool: one task at a time, in the worker process itself"
    pool = "solo"
    DEFAULT_CONCURRENCY = 1  # the solo pool runs one task, whatever worker_concurrency says
