"""saq's app mode (crashbench.designs.saqlib, whose docstring says what runs): the user's settings,
read where saq is installed (the workers' interpreter), and the Worker made from them.

`--app module:settings` is the dict `saq module.settings` runs (or a function returning one):
queue, functions, concurrency, startup, before_process, after_process, timers, ... Its queue is
replaced by a Queue on the run's server with crashbench's name (saqlib's key layout), and must be a
Redis queue; everything else is kept. The ledger comes from saq's own before_process and
after_process hooks, put first in the user's lists: a start, then an end when the job's status is
complete, else (failed, retried, aborted by a sweep) a failed attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crashbench.designs import app as user
from crashbench.errors import UsageError


def _settings(spec: str) -> dict[str, Any]:
    """The user's settings dict, as saq.worker.import_settings reads it."""
    settings = user.importable(spec, "app")
    if callable(settings):
        try:
            settings = settings()
        except Exception as exc:  # the user's code: one line naming it
            raise UsageError(f"app {spec}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(settings, dict):
        raise UsageError(f"app {spec} is a {type(settings).__name__}, not saq settings (a dict)")
    from saq.queue.redis import RedisQueue

    queue = settings.get("queue")
    if queue is not None and not isinstance(queue, RedisQueue):
        raise UsageError(f"app {spec} has a {type(queue).__name__}: crashbench tests saq on Redis (a RedisQueue)")
    return dict(settings)


def _functions(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings' functions by saq's name for each (a (name, function) pair, or its __qualname__)."""
    functions = settings.get("functions", ())
    return dict(f if isinstance(f, tuple) else (getattr(f, "__qualname__", repr(f)), f) for f in functions)


def _many(hooks: Any) -> list[Any]:
    return [] if hooks is None else [hooks] if callable(hooks) else list(hooks)


def describe_app(spec: str, task: str) -> dict[str, Any]:
    """In the workers' interpreter (app.probe): the task checked, and the Worker settings that decide
    recovery (concurrency, timers)."""
    settings = _settings(spec)
    if task not in (functions := _functions(settings)):
        names = ", ".join(functions) or "none"
        raise UsageError(f"app {spec} has no function {task!r}", hint=f"its functions: {names}")
    return {"options": {k: settings[k] for k in ("concurrency", "timers") if k in settings}}


def serve_app(design: Any, ready: Callable[[], None]) -> None:
    """The user's Worker on the run's queue, with the ledger's hooks (a saqlib design's `serve`)."""
    from saq import Worker
    from saq.job import Status

    settings = _settings(design.settings.app)
    contexts, prefix = user.Contexts(), design.prefix

    def job_id(ctx: dict[str, Any]) -> str:
        return str(ctx["job"].key).removeprefix(prefix)

    async def started(ctx: dict[str, Any]) -> None:
        contexts.started(job_id(ctx))

    async def ended(ctx: dict[str, Any]) -> None:
        contexts.ended(job_id(ctx), ctx["job"].status == Status.COMPLETE)

    async def up(ctx: dict[str, Any]) -> None:
        ready()

    design.app_options = describe_app(design.settings.app, design.settings.task)["options"]
    options = design.worker_options()  # ours, the user's (concurrency, timers), then the scenario's
    settings.update(
        options,
        startup=[*_many(settings.get("startup")), up],
        before_process=[started, *_many(settings.get("before_process"))],
        after_process=[ended, *_many(settings.get("after_process"))],
    )

    async def main() -> None:
        # As saqlib's own worker: the default executor (asyncio.to_thread) as wide as the concurrency.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(options["concurrency"]))
        queue = design.saq_queue()
        try:
            await queue.connect()
            await Worker(**{**settings, "queue": queue}).start()
        finally:
            await queue.disconnect()

    asyncio.new_event_loop().run_until_complete(main())
