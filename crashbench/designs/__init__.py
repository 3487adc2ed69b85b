"""The queue-design interface and the registry of designs by name.

A design is a class with five duties: `enqueue` (producer), `fetch` and `ack` (worker; `fail` when
the handler raised), `recover` (the reaper and the delayed-retry mover, called by the harness on a
timer) and `state` / `backlog` (what the queue says it still holds). One instance per process: the
harness makes one for enqueueing, reaping and inspection, and every worker makes its own after it is
forked.

The counts never trust `state()`: the harness reads Redis itself (crashbench.evidence.inspector) and the
design only says how a stored entry maps to a job id (`job_of`; the built-ins share one payload
format, JSON with an "id"), which keys are dead letters, delayed retries or bookkeeping, and, for a
library's own layout, how to read it (`locate`). `state()` is then checked against that reading.

Built-in designs are imported lazily, so a worker only imports the module it runs.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from crashbench.errors import UsageError
from crashbench.model.queue import OBSERVE_DEFAULT, key_entries, matches
from crashbench.model.queue import DesignSettings as DesignSettings
from crashbench.model.queue import EnqueueUnconfirmed as EnqueueUnconfirmed
from crashbench.model.queue import Entry as Entry  # re-exported: designs import it from here
from crashbench.model.queue import Job as Job
from crashbench.model.queue import Located as Located
from crashbench.model.queue import QueueState as QueueState
from crashbench.model.queue import Receipts as Receipts
from crashbench.model.queue import StreamEnd as StreamEnd
from crashbench.model.queue import observe_for as observe_for
from crashbench.model.queue import receipts as receipts
from crashbench.model.stored import Snapshot as Snapshot

if TYPE_CHECKING:
    import redis

    from crashbench.control.interpreter import WorkerPython


class Design(ABC):
    """Base class for a queue design under test. Subclass it, set `name`, implement the abstract methods.

    `client` is a redis-py client with decode_responses=True. Every key must start with `prefix`
    (use `self.key(...)`), which is how crashbench keeps runs apart and cleans up after itself; a design
    that sets `spread` may also use shard prefixes of it (crashbench.control.connect.shard_prefix).
    Times (`now`) are the harness clock: time.monotonic() seconds, shared by all processes on a host.
    """

    name: ClassVar[str] = ""  # what tables and results call it (the registry's key for a built-in)
    summary: ClassVar[str] = ""  # one line, for `crashbench list`
    # False when the design keeps keys outside `prefix` (a library's own key layout): it may then run
    # only on a server crashbench started, never on --redis-url.
    namespaced: ClassVar[bool] = True
    # True for LibraryDesign: the worker process runs the library's own worker loop (`serve`) instead
    # of fetch/ack; faults then go to the worker's process tree (a library may fork a child per job).
    own_worker: ClassVar[bool] = False
    # The module a worker of this design imports besides crashbench and redis (a queue library), or "".
    # It is checked before the run, in crashbench's environment or the --worker-python one.
    library: ClassVar[str] = ""
    # Modules its worker imports besides `library` (celery:gevent's gevent), checked and reported as it is.
    requires: ClassVar[tuple[str, ...]] = ()
    # A module its workers run as `python -m` in a fresh interpreter (crashbench's, or --worker-python's),
    # not in a fork of crashbench, which has imported socket and redis: gevent's patching must come first.
    worker_module: ClassVar[str] = ""
    # fnmatch patterns of key names (without the prefix) the inspector reads as dead letters, as
    # delayed retries, or skips as bookkeeping (worker names, heartbeats, sets of ids that are not jobs).
    DEAD_LETTERS: ClassVar[tuple[str, ...]] = ()
    DELAYED: ClassVar[tuple[str, ...]] = ()
    BOOKKEEPING: ClassVar[tuple[str, ...]] = ()
    # True when a job whose handler raised is forgotten (no retry, no dead letter): such a job counts
    # as failed, not lost. A design that retries or dead-letters leaves it False: its failed job that
    # then vanished is a loss.
    drops_failed: ClassVar[bool] = False
    # True for a design that promises each job runs once: a duplicate then makes its history invalid.
    exactly_once: ClassVar[bool] = False
    # True when state() reports every job its recovery gives back (requeued, requeue_events): the
    # ledger's redeliveries must then all be among them (crashbench.evidence.checks.requeues).
    counts_requeues: ClassVar[bool] = False
    # Seconds backlog() must stay 0, with no handler running, before the run counts as drained: for a
    # queue that can hold a job where backlog() cannot see it for a while (saq's sweep holds one in
    # memory while it waits on its worker, then puts it back).
    SETTLE_S: ClassVar[float] = 0.0
    # True when its keys span hash slots (crashbench.control.connect.shard_prefix): the harness then reads and
    # expires them on every primary of a cluster, not on the one of the run's slot.
    spread: ClassVar[bool] = False
    # True when `enqueue` delays each job by its Job.delay_s through the queue's own delay API; else a
    delays: ClassVar[bool] = False  # delayed workload is refused, with `no_delays` as the reason when set
    no_delays: ClassVar[str] = ""
    waits_aof: ClassVar[bool] = False  # broker.wait_aof: its enqueue confirms with WAITAOF (crashbench.designs.durable)

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        """One instance in the runner (enqueue, recover, backlog, state) and one in each worker process
        (start_worker, fetch, ack); `client` decodes responses, `settings` are the scenario's."""
        self.r = client
        self.prefix = prefix
        self.settings = settings

    def key(self, *parts: str) -> str:
        """A key of the design's namespace: the prefix, then `parts` joined by ":"."""
        return self.prefix + ":".join(parts)

    def url(self) -> str:
        """The server's URL, for a library that wants one rather than a client. It carries the
        password: hand it to the library only, never to a message (crashbench.redact.redact_url)."""
        # A cluster's client: the node it asked first, which a library's cluster client asks for the others.
        node = self.r.get_default_node() if hasattr(self.r, "get_default_node") else None
        pool = node.redis_connection.connection_pool if node is not None else self.r.connection_pool
        kw = pool.connection_kwargs
        # Percent-encoded: a password with `@`, `:` or `/` would otherwise end the userinfo early.
        user = quote(kw.get("username") or "", safe="")
        auth = f"{user}:{quote(kw['password'], safe='')}@" if kw.get("password") else ""
        db = "" if node is not None else f"/{kw.get('db', 0)}"  # a cluster has database 0 only, and takes no /db
        return f"redis://{auth}{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}{db}"

    def observe_window(self) -> float:
        """Default seconds to keep watching after the last fault for the queue to give jobs back: long
        enough for its documented recovery (a library's visibility or heartbeat timeout) to act."""
        return max(OBSERVE_DEFAULT, 10 * self.settings.stale_after)

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Create what the queue needs before the first enqueue (consumer groups, ...)."""

    def start_worker(self, worker: str, now: float) -> None:  # noqa: B027 - optional hook
        """Called once in each worker process before its first fetch (register, first heartbeat)."""

    @abstractmethod
    def enqueue(self, jobs: Sequence[Job]) -> Sequence[str] | None:
        """Make every job in `jobs` available to workers. May return one receipt per job, in order: a
        stream design returns the entry ids XADD answered, which the timeline keeps so that the harness
        can tell, from its own reading at the end, which jobs' entries the stream trimmed."""

    @abstractmethod
    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        """Hand one job to `worker`, waiting at most `timeout` seconds; None when there is none."""

    @abstractmethod
    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        """The handler of `job` finished: the queue may forget it. Returns whether the queue still held
        this delivery and forgot it (False: nothing left to acknowledge, recovery or another worker had
        it), or None where the design cannot tell; the ledger records an empty ack (crashbench's own
        worker), never the counts' evidence of anything but itself."""

    def fetch_batch(self, worker: str, timeout: float, now: float) -> list[Job]:
        """Hand `worker` the jobs of one round trip (a batching design: up to settings.batch_size); the
        worker runs them in order, then `ack_batch`es the ones that finished. By default one `fetch`."""
        job = self.fetch(worker, timeout, now)
        return [] if job is None else [job]

    def ack_batch(self, worker: str, jobs: Sequence[Job], now: float) -> list[bool | None]:
        """Acknowledge the finished jobs of one batch; by default one `ack` each. One answer per job, as
        `ack`'s."""
        return [self.ack(worker, job, now) for job in jobs]

    def fail(self, worker: str, job: Job, now: float) -> None:
        """The handler of `job` raised. Retry it later or dead-letter it; by default it is forgotten."""
        self.ack(worker, job, now)

    def heartbeat(self, worker: str, job: Job, now: float) -> None:  # noqa: B027 - optional hook
        """Called every `settings.heartbeat_every` seconds inside a long handler, when that is on."""

    def stop_worker(self, worker: str, now: float) -> None:  # noqa: B027 - optional hook
        """A graceful stop (SIGTERM): the worker finished its job; hand back anything it still holds."""

    def recover(self, now: float) -> int | None:
        """One recovery pass at time `now`: give back jobs of workers that look dead, move due retries.
        Returns how many jobs it gave back, or None where it cannot tell (the timeline shows it, as the
        design's own figure: the counts never use it)."""
        return None

    @abstractmethod
    def backlog(self) -> int:
        """Jobs the queue still holds (waiting or in flight); 0 means drained. Called often: keep it cheap."""

    @abstractmethod
    def state(self) -> QueueState:
        """Everything the queue says it holds by job id, read once at the end of a run. The harness
        checks it against its own reading of Redis (`locate`)."""

    # -- how the harness reads this design's keys (crashbench.evidence.inspector) ---------------------------

    def key_patterns(self) -> list[str]:
        """SCAN MATCH patterns of every key this design may write: by default its namespace."""
        return [self.prefix + "*"]

    def job_of(self, key: str, entry: Entry) -> str | None:
        """The job id a stored entry of `key` (its name without the prefix) carries, or None when it is
        not a job. The built-ins store JSON objects with an "id" (and stream entries with an id field)."""
        if isinstance(entry, dict):
            value = entry.get(b"id")
            return value.decode(errors="replace") if value is not None else None
        try:
            data = json.loads(entry)
        except ValueError:
            return None
        job = data.get("id") if isinstance(data, dict) else None
        return job if isinstance(job, str) else None

    def relative(self, name: str) -> str:
        """A key's name as BOOKKEEPING, DEAD_LETTERS, DELAYED and `job_of` see it: without the prefix."""
        return name.removeprefix(self.prefix)

    def locate(self, snapshot: Snapshot) -> Located:
        """Every job in the snapshot, with where it sits: each key of the namespace that is not
        bookkeeping, entry by entry through `job_of`."""
        found = Located()
        for key in snapshot.keys.values():
            rel = self.relative(key.name)
            if matches(rel, self.BOOKKEEPING):
                continue
            kind = "dead" if matches(rel, self.DEAD_LETTERS) else "delayed" if matches(rel, self.DELAYED) else "held"
            if key.type == "stream":
                found.streams[rel] = StreamEnd.of(key)
            for where, entry in key_entries(key, rel):
                job = self.job_of(rel, entry)
                if job is not None:
                    found.add(job, where, kind)
        return found


# A reliable library configuration sizes its visibility / job timeout to the workload, as the libraries'
# documentation asks: above the longest job, with room for a slow machine.
TIMEOUT_HEADROOM = 2.0
TIMEOUT_PAD = 1.0  # seconds


class LibraryDesign(Design):
    """Base of the queue-library adapters: the library's own worker takes and acknowledges the jobs
    (`serve`), so crashbench's fetch / ack are never called."""

    own_worker = True
    # Handlers one worker process runs at once as the library ships (threads, tasks, pool processes).
    DEFAULT_CONCURRENCY: ClassVar[int] = 1
    # True when the library has a cluster client of its own (taskiq-redis's cluster brokers): on a Redis
    # Cluster the design is then given the cluster, and picks that client (`on_cluster`). Else it is given
    # one primary's URL, as the library's users would give it the cluster, and its error is the answer.
    cluster_client: ClassVar[bool] = False
    # True when the adapter runs the user's own app ([app]: crashbench.designs.app) as well as crashbench's handler.
    runs_apps: ClassVar[bool] = False
    # Why the library's own Sentinel support cannot run this configuration (refused under sentinel-kill), or "".
    no_sentinel: ClassVar[str] = ""

    def load_app(self, python: WorkerPython | None) -> None:
        """With an [app], in the harness before any worker starts: load what the harness needs of the
        user's app (its task's name, its library settings), refusing bad input with a UsageError.
        `python`: the workers' interpreter (--worker-python), which may have a library the harness
        lacks (crashbench.designs.app.probe). By default nothing: an adapter whose library the harness
        imports loads the app in __init__."""

    def on_cluster(self) -> bool:
        """Whether this run's client is a Redis Cluster's (crashbench.control.connect)."""
        from redis.cluster import RedisCluster  # as the module's other redis imports: not at import time

        return isinstance(self.r, RedisCluster)

    def concurrency(self) -> int:
        """How many handlers one worker runs at once: queue.concurrency, else the library's default. The
        library's own option in [library."<design>"] (worker_threads, max_jobs, ...) wins over both."""
        return self.settings.concurrency or self.DEFAULT_CONCURRENCY

    def job_timeout(self) -> float:
        """The visibility / job timeout a reliable configuration uses: stale_after, raised above the
        workload's longest job (TIMEOUT_HEADROOM x longest + TIMEOUT_PAD) so no healthy job is re-run or
        cancelled."""
        return max(self.settings.stale_after, TIMEOUT_HEADROOM * self.settings.longest_job + TIMEOUT_PAD)

    def redelivery_s(self) -> float | None:
        """Seconds from a worker's death until the library gives its job back, from every timer that
        decides it in the configuration in use; None: the library never does."""
        return None

    def observe_window(self) -> float:
        """The library's redelivery time plus a margin (observe_for), else the built-ins' default."""
        redelivery = self.redelivery_s()
        return super().observe_window() if redelivery is None else observe_for(redelivery)

    def configuration(self) -> dict[str, Any]:
        """The settings in effect that decide recovery (timeouts, ...), shown with the result; the key
        "concurrency" is the handlers one worker runs at once, whatever the library calls it."""
        return {"concurrency": self.concurrency()}

    def config_warnings(self) -> list[str]:
        """Settings that would make the library re-run or cancel a healthy job of this workload (a
        timeout below the longest job), said before the run starts."""
        return []

    def library_timeout_warning(self, what: str, seconds: float, effect: str) -> list[str]:
        """A warning when a library timeout `what` of `seconds` is not above the longest job."""
        longest = self.settings.longest_job
        if seconds > longest:
            return []
        return [f"{self.name}: {what} {seconds:g} s is not above the longest job ({longest:g} s): {effect}"]

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        raise NotImplementedError(f"{self.name}: the library's worker fetches its own jobs")

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        raise NotImplementedError(f"{self.name}: the library's worker acknowledges its own jobs")

    @abstractmethod
    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        """Run the library's worker in this process until it stops, calling `ready()` once it is about to
        take jobs (the READY handshake). Its task is `crashbench.designs.handler.handle(job_id)`, which writes the
        ledger."""


def check_app(cls: type[Design], spec: str, settings: DesignSettings) -> None:
    """Refuse an [app] for a design that cannot run one: crashbench's own designs run its handler."""
    if settings.task and not getattr(cls, "runs_apps", False):
        raise UsageError(
            f"{spec} cannot run your app (--app/--task): it is not a library adapter that runs one",
            hint=f"give --design one of: {', '.join(APP_LIBRARIES)}",
        )


def library_settings(design: Design) -> tuple[dict[str, Any], list[str]]:
    """A library design's configuration in effect and its warnings for this workload; nothing for a
    built-in design (crashbench's own settings are in the scenario)."""
    if not isinstance(design, LibraryDesign):
        return {}, []
    configuration = design.configuration()
    if (redelivery := design.redelivery_s()) is not None:
        configuration["redelivery_s"] = redelivery
    return configuration, design.config_warnings()


BUILTIN: dict[str, str] = {
    "naive": "crashbench.designs.naive:NaiveQueue",
    "reliable": "crashbench.designs.reliable:ReliableQueue",
    "stream": "crashbench.designs.stream:StreamQueue",
    "reliable-batch": "crashbench.designs.reliable_batch:ReliableBatchQueue",
    "reliable-ids": "crashbench.designs.reliable_noid:ReliableIds",
    "reliable-noid": "crashbench.designs.reliable_noid:ReliableNoId",
    "stream-batch": "crashbench.designs.stream_batch:StreamBatchQueue",
    "stream-reuse": "crashbench.designs.stream_reuse:StreamReuseQueue",
    "priority": "crashbench.designs.priority:PriorityQueue",
    "migrating": "crashbench.designs.migrating:MigratingQueue",
    "sharded": "crashbench.designs.sharded:ShardedQueue",
    "rq": "crashbench.designs.rqlib:RQQueue",
    "rq:reliable": "crashbench.designs.rqlib:RQReliable",
    "celery": "crashbench.designs.celerylib:CeleryQueue",
    "celery:acks-late": "crashbench.designs.celerylib:CeleryAcksLate",
    "celery:threads": "crashbench.designs.celerylib:CeleryThreads",
    "celery:gevent": "crashbench.designs.celerylib:CeleryGevent",
    "celery:solo": "crashbench.designs.celerylib:CelerySolo",
    "dramatiq": "crashbench.designs.dramatiqlib:DramatiqQueue",
    "dramatiq:reliable": "crashbench.designs.dramatiqlib:DramatiqReliable",
    "huey": "crashbench.designs.hueylib:HueyQueue",
    "huey:requeue": "crashbench.designs.hueylib:HueyRequeue",
    "arq": "crashbench.designs.arqlib:ArqQueue",
    "arq:reliable": "crashbench.designs.arqlib:ArqReliable",
    "taskiq": "crashbench.designs.taskiqlib:TaskiqList",
    "taskiq:stream": "crashbench.designs.taskiqlib:TaskiqStream",
    "taskiq:reliable": "crashbench.designs.taskiqlib:TaskiqReliable",
    "saq": "crashbench.designs.saqlib:SaqQueue",
    "saq:reliable": "crashbench.designs.saqlib:SaqReliable",
}
# The library adapters that run a user's app (their class sets runs_apps; tests/test_app.py holds them equal).
APP_LIBRARIES: tuple[str, ...] = ("celery", "rq", "dramatiq", "huey", "arq", "taskiq", "saq")
# The optional dependency a built-in design needs, for the error message when it is missing.
EXTRAS: dict[str, str] = {
    "rq": "rq", "rq:reliable": "rq", "celery": "celery", "celery:acks-late": "celery", "celery:threads": "celery",
    "celery:gevent": "celery", "celery:solo": "celery",
    "dramatiq": "dramatiq", "dramatiq:reliable": "dramatiq", "huey": "huey", "huey:requeue": "huey",
    "taskiq": "taskiq", "taskiq:stream": "taskiq", "taskiq:reliable": "taskiq",
}  # fmt: skip

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _import(spec: str) -> type[Design]:
    module_name, _, attr = spec.partition(":")
    if str(Path.cwd()) not in sys.path:
        # A user's design module lives in their project, like a Celery or RQ app module.
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is a usage problem
        raise UsageError(f"cannot import design module {module_name!r}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Design)):
        raise UsageError(f"{spec} is not a subclass of crashbench.designs.Design")
    return cls


def load_design(spec: str) -> type[Design]:
    """A design class from a built-in name or `package.module:Class`."""
    if spec in BUILTIN:
        try:
            return _import(BUILTIN[spec])
        except UsageError as exc:
            if spec in EXTRAS:
                raise UsageError(exc.message, hint=f"pip install 'crashbench[{EXTRAS[spec]}]'") from None
            raise
    if _SPEC.match(spec):
        return _import(spec)
    known = ", ".join(BUILTIN)
    raise UsageError(f"unknown design {spec!r}", hint=f"built-in designs: {known}; or give package.module:Class")


def safe_name(spec: str) -> str:
    """A design spec made safe for a Redis key segment and a SCAN pattern."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", spec)
