"""arq and arq:reliable: the arq library (0.26+, asyncio) with its own Worker, as a user runs it.

arq pins redis-py < 6, so it usually cannot share crashbench's environment: its workers then run
under `--worker-python PATH`, an interpreter that has arq. This module must import without arq for
that reason: the harness side (enqueue, backlog, state) speaks arq's key layout and job format with
plain redis-py, and only `serve`, in the worker, imports arq.

Keys: arq's own layout, outside crashbench's namespace (so these designs refuse --redis-url); each
arq job id is the run prefix P followed by crashbench's job id (A):
    P queue                 sorted set of arq job ids by due time (a deferred job's, enqueue_job's
                            _defer_by, in the future); a job stays in it until it ends
    arq:job:A               the job: pickle of {t: try, f: function, a: args, k: kwargs, et: enqueued ms}
    arq:in-progress:A       set, with a TTL of job_timeout + 10 s, by the worker that starts the job
    arq:retry:A             how many times the job was started
    arq:result:A            pickle of the outcome, success or not, kept keep_result seconds
    P queue:health-check    the worker's health line

The queue names arq job ids only; a job is held there only while its arq:job key exists (a worker
that dequeues an id whose job key is gone fails it as expired). A result with success False is arq's
record of a failure.

A worker polls the queue every poll_delay and starts a due job unless its in-progress key exists.
Nothing acknowledges a job before it ends, so a job whose worker was killed stays in the queue; once
its in-progress key expires (job_timeout + 10 s after the start; job_timeout is 300 s by default)
the next worker's poll starts it again. A job started more than max_tries times (5) is failed with
"max retries exceeded". A handler that raises fails the job (arq retries only on its `Retry`).

job_timeout is a hard limit in arq, not a visibility timeout: a job running longer is cancelled and
recorded failed (TimeoutError), although its handler thread may still finish.

    arq            as installed: job_timeout 300 s (a killed job runs again after 310 s)
    arq:reliable   job_timeout above the longest job (LibraryDesign.job_timeout: 1 s for the default
                   10 ms jobs), max_tries = queue.max_attempts (a killed job runs again after
                   job_timeout + 10 s, the 10 s fixed by arq)

Both run arq's shipped max_jobs = 10 concurrent jobs per worker process (queue.concurrency changes
it); [library."<design>"] overrides any Worker argument, max_jobs included. The synchronous handler
runs through asyncio.to_thread, so at most min(32, CPUs + 4) of them at once (the loop's default
executor); a job waiting there for a thread counts against job_timeout and can time out unstarted.

App mode ([app]: crashbench.designs.app): `--app module:WorkerSettings` (the class, or dict, that
`arq module.WorkerSettings` runs) and `--task NAME`, one of its functions by arq's name for it. The
worker runs arq's Worker from the user's settings (functions, job_timeout, max_tries, max_jobs,
keep_result, their own hooks, ...) with two things swapped: redis_settings (the run's server; the
user's connection options kept) and queue_name (P queue, above). Each job is what arq's
enqueue_job(NAME, *args, _job_id=P<id>, **kwargs) writes (arq's default pickle serializer: settings
with a job_serializer of their own are refused). The ledger comes from arq's own on_job_start and
on_job_end hooks, chained before / after the user's; on_job_end is given no outcome, so the task's
function is watched (its return marks the ctx arq passes both): returned is a completion, anything
else (raised, cancelled at job_timeout, retried) a failed attempt. arq is not in crashbench's
environment, so the harness reads the settings through the workers' interpreter (app.probe): an app
that does not import there, or has no such function, is one line before any worker starts. The
queue.max_attempts / job_timeout of arq:reliable do not apply: the user's settings do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import io
import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import redis

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.model.stored import Snapshot

if TYPE_CHECKING:
    from crashbench.control.interpreter import WorkerPython

FUNCTION = "crashbench_handle"
EXPIRES_MS = 86_400_000  # arq's expires_extra_ms: a job not started within a day is dropped
ARQ_FIXED_EXTRA_S = 10  # arq keeps the in-progress key job_timeout + 10 s
ARQ_JOB_TIMEOUT = 300  # arq's Worker defaults
ARQ_POLL_DELAY = 0.5
ADDRESS = ("host", "port", "unix_socket_path", "database", "username", "password", "ssl")  # RedisSettings'
DONE = "crashbench_returned"  # app mode: set in the job's ctx when the user's function returned


class _Opaque:
    """Stands in for a class the harness cannot import (an exception defined by arq)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    """arq's results pickle the exception a job ended with; the harness may not have arq installed."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _Opaque


def _load(raw: bytes) -> dict[str, Any]:
    return _Unpickler(io.BytesIO(raw)).load()


def _success(raw: bytes) -> bool | None:
    """Whether a stored arq result says the job succeeded; None for a value that is not a result arq
    wrote (it records neither outcome)."""
    try:
        result = _load(raw)
    except Exception:  # whatever unpickling fails with, the value is not a result arq wrote
        return None
    if not isinstance(result, dict) or not isinstance(result.get("s"), bool):
        return None
    return result["s"]


async def crashbench_handle(ctx: dict[str, Any], job_id: str) -> None:
    # The handler is synchronous (it sleeps); a thread keeps arq's event loop and job timeout alive.
    await asyncio.to_thread(handle, job_id, ctx["job_try"])


class ArqQueue(LibraryDesign):
    name = "arq"
    summary = "arq as installed: a killed job runs again once its in-progress key expires, 310 s later"
    library = "arq"
    namespaced = False
    reliable: ClassVar[bool] = False
    drops_failed = False  # a job that raised leaves a result with success False (kept keep_result seconds)
    DEFAULT_CONCURRENCY = 10  # arq's Worker max_jobs default
    runs_apps = True
    delays = True  # enqueue_job(_defer_by=): the queue's score is the due time; a poll starts it once due

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.queue = self.key("queue")
        self.function = settings.task or FUNCTION
        self.app_options: dict[str, Any] = {}  # app mode: the user's settings that decide recovery (load_app)
        pool = client.connection_pool
        kwargs = {**pool.connection_kwargs, "decode_responses": False}  # arq stores pickled data
        self.raw = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))

    def load_app(self, python: WorkerPython | None) -> None:
        described = user.probe(python, f"{__name__}:describe_app", self.settings.app, self.settings.task)
        self.app_options = described["options"]

    def worker_options(self) -> dict[str, Any]:
        """arq Worker arguments: ours (app mode: the user's), then the scenario's [library.<design>] table."""
        if self.settings.task:
            given = {"max_jobs": self.settings.concurrency} if self.settings.concurrency else {}
            return {"max_jobs": self.DEFAULT_CONCURRENCY, **self.app_options, **given, **self.settings.options}
        options: dict[str, Any] = {"max_jobs": self.concurrency()}
        if self.reliable:
            options.update(job_timeout=self.job_timeout(), max_tries=self.settings.max_attempts)
        return {**options, **self.settings.options}

    def redelivery_s(self) -> float:
        # The in-progress key outlives the kill by job_timeout + 10 s; the next poll then starts the job.
        options = self.worker_options()
        timeout = float(options.get("job_timeout", ARQ_JOB_TIMEOUT))
        return timeout + ARQ_FIXED_EXTRA_S + options.get("poll_delay", ARQ_POLL_DELAY)

    def configuration(self) -> dict[str, Any]:
        options = self.worker_options()
        # The handler runs through asyncio.to_thread: at most the loop's default executor's threads at once.
        threads = min(32, (os.cpu_count() or 1) + 4)
        return {
            "concurrency": min(options["max_jobs"], threads), "max_jobs": options["max_jobs"],
            "job_timeout_s": float(options.get("job_timeout", ARQ_JOB_TIMEOUT)),
            "max_tries": options.get("max_tries", 5),
        }  # fmt: skip

    def config_warnings(self) -> list[str]:
        return self.library_timeout_warning(
            "job_timeout", float(self.worker_options().get("job_timeout", ARQ_JOB_TIMEOUT)),
            "arq cancels a job still running at its timeout and records it failed (TimeoutError)",
        )  # fmt: skip

    def _arq_id(self, job_id: str) -> str:
        return self.prefix + job_id

    def enqueue(self, jobs: Sequence[Job]) -> None:
        # What arq's ArqRedis.enqueue_job writes (arq.jobs.serialize_job), without importing arq.
        now_ms = int(time.time() * 1000)
        pipe = self.raw.pipeline(transaction=False)
        for job in jobs:
            args, kwargs = user.arguments(job) if self.settings.task else ([job.id], {})
            data = {"t": None, "f": self.function, "a": tuple(args), "k": kwargs, "et": now_ms}
            defer_ms = round(job.delay_s * 1000)  # enqueue_job(_defer_by=): the score is the due time
            pipe.psetex(f"arq:job:{self._arq_id(job.id)}", EXPIRES_MS + defer_ms, pickle.dumps(data))
            pipe.zadd(self.queue, {self._arq_id(job.id): now_ms + defer_ms})
        pipe.execute()

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        from arq.worker import Worker, func

        if self.settings.task:
            self._serve_app(ready)
            return

        async def startup(ctx: dict[str, Any]) -> None:
            ready()

        Worker(
            functions=[func(crashbench_handle, name=FUNCTION)],
            queue_name=self.queue,
            redis_settings=self.redis_settings(),
            on_startup=startup,
            **self.worker_options(),
        ).run()

    def redis_settings(self) -> Any:
        """arq's RedisSettings of the run's server; on a Sentinel topology (a worker's, under sentinel-kill),
        arq's own Sentinel settings: the sentinels as its host list, sentinel=True, the master's name."""
        from arq.connections import RedisSettings

        if (parts := sentinels.topology(self.r)) is None:
            return RedisSettings.from_dsn(self.url())
        return RedisSettings(
            host=list(parts.sentinels), sentinel=True, sentinel_master=parts.master, database=parts.db,
            password=parts.password,
        )  # fmt: skip

    def _serve_app(self, ready: Callable[[], None]) -> None:
        """The user's settings, on the run's server and queue, with the ledger's hooks (module docstring)."""
        from arq.worker import Worker

        kwargs = _app_kwargs(self.settings.app)
        functions = _functions(self.settings.app, kwargs)
        contexts, job_id = user.Contexts(), self._job_id
        own_startup, own_start, own_end = (kwargs.get(k) for k in ("on_startup", "on_job_start", "on_job_end"))

        async def startup(ctx: dict[str, Any]) -> None:
            if own_startup is not None:
                await own_startup(ctx)
            ready()

        async def job_start(ctx: dict[str, Any]) -> None:
            contexts.started(job_id(ctx["job_id"]))
            if own_start is not None:
                await own_start(ctx)

        async def job_end(ctx: dict[str, Any]) -> None:
            try:
                if own_end is not None:
                    await own_end(ctx)
            finally:
                contexts.ended(job_id(ctx["job_id"]), ctx.get(DONE) is True)

        run = self.redis_settings()
        theirs = kwargs.get("redis_settings")
        address = {f: getattr(run, f) for f in (*ADDRESS, "sentinel", "sentinel_master")}
        redis_settings = dataclasses.replace(theirs, **address) if theirs is not None else run
        functions[self.settings.task] = _watched(functions[self.settings.task])
        kwargs.pop("redis_pool", None)
        kwargs.update(functions=list(functions.values()), queue_name=self.queue, redis_settings=redis_settings,
                      on_startup=startup, on_job_start=job_start, on_job_end=job_end)  # fmt: skip
        if self.settings.concurrency:
            kwargs["max_jobs"] = self.settings.concurrency
        Worker(**{**kwargs, **self.settings.options}).run()

    def backlog(self) -> int:
        return int(self.raw.zcard(self.queue))

    def _job_id(self, arq_id: bytes | str) -> str:
        text = arq_id.decode() if isinstance(arq_id, bytes) else arq_id
        return text.removeprefix(self.prefix)

    def state(self) -> QueueState:
        held: dict[str, str] = {}
        for arq_id in self.raw.zrange(self.queue, 0, -1):
            running = self.raw.exists(b"arq:in-progress:" + arq_id)
            held[self._job_id(arq_id)] = "in-progress" if running else "queue"
        failed = set()
        for key in self.raw.scan_iter(match=f"arq:result:{self.prefix}*".encode(), count=1000):
            raw = self.raw.get(key)
            if raw is not None and not _load(raw).get("s", True):
                failed.add(self._job_id(key.removeprefix(b"arq:result:")))
        return QueueState(held=held, failed=failed)

    def key_patterns(self) -> list[str]:
        # The queue and the health check live under the prefix; each per-job key is "arq:<kind>:" then
        # an arq id, which starts with the prefix.
        kinds = ("job", "in-progress", "retry", "result")
        return [self.prefix + "*", *(f"arq:{kind}:{self.prefix}*" for kind in kinds)]

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        queue = snapshot.keys.get(self.queue)
        for member in queue.items if queue is not None else ():
            arq_id = member.decode(errors="replace")
            body = snapshot.keys.get(f"arq:job:{arq_id}")
            if not arq_id.startswith(self.prefix) or body is None or body.type != "string":
                continue
            running = f"arq:in-progress:{arq_id}" in snapshot.keys
            found.add(self._job_id(arq_id), "in-progress" if running else "queue")
        results = f"arq:result:{self.prefix}"
        for name, stored in snapshot.keys.items():
            if name.startswith(results) and stored.type == "string" and stored.items:
                success = _success(stored.items[0])
                if success is not None:
                    kind = "succeeded" if success else "failed"
                    found.add(self._job_id(name.removeprefix("arq:result:")), "result", kind)
        return found


def _app_kwargs(spec: str) -> dict[str, Any]:
    """The Worker arguments of the user's settings (a class or a dict, as `arq` reads them); where arq is."""
    from arq.worker import get_kwargs

    settings = user.importable(spec, "app")
    if not isinstance(settings, (type, dict)):
        raise UsageError(f"app {spec} is a {type(settings).__name__}, not arq WorkerSettings (a class or a dict)")
    kwargs = dict(get_kwargs(settings))
    if kwargs.get("job_serializer") is not None or kwargs.get("job_deserializer") is not None:
        raise UsageError(f"app {spec} sets job_serializer: crashbench enqueues in arq's default format (pickle)")
    return kwargs


def _functions(spec: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settings' functions by arq's name for each (arq.worker.func)."""
    from arq.worker import func

    try:
        return {f.name: f for f in map(func, kwargs.get("functions") or ())}
    except Exception as exc:  # a function arq refuses (not a coroutine function, a path that does not import)
        raise UsageError(f"app {spec}: arq refuses its functions: {type(exc).__name__}: {exc}") from None


def describe_app(spec: str, task: str) -> dict[str, Any]:
    """In the workers' interpreter (app.probe): the task checked, and the settings that decide recovery."""
    from arq.utils import to_seconds
    from arq.worker import Worker

    kwargs = _app_kwargs(spec)
    functions = _functions(spec, kwargs)
    if task not in functions:
        names = ", ".join(functions) or "none"
        raise UsageError(f"app {spec} has no function {task!r}", hint=f"its functions: {names}")
    defaults = inspect.signature(Worker).parameters
    options = {name: kwargs.get(name, defaults[name].default) for name in ("max_jobs", "max_tries")}
    for name in ("job_timeout", "poll_delay"):
        options[name] = to_seconds(kwargs.get(name, defaults[name].default))
    if functions[task].timeout_s is not None:  # func(..., timeout=) wins over the Worker's
        options["job_timeout"] = functions[task].timeout_s
    if functions[task].max_tries is not None:
        options["max_tries"] = functions[task].max_tries
    return {"options": options}


def _watched(function: Any) -> Any:
    """The user's arq Function, its coroutine marking the job's ctx once it returned (DONE)."""
    inner = function.coroutine

    async def coroutine(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = await inner(ctx, *args, **kwargs)
        ctx[DONE] = True
        return result

    return dataclasses.replace(function, coroutine=coroutine)


class ArqReliable(ArqQueue):
    name = "arq:reliable"
    summary = "arq, job_timeout above the longest job, max_tries = max_attempts: killed jobs rerun 10 s after it"
    reliable = True
