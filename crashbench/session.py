"""A session: one server (embedded or external), one scenario, one or more designs run in turn on
the same fault schedule, and the result that comes out of it. This is the core's entry point; the
CLI only parses options and renders."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Sequence

import redis

from crashbench.designs import load_design
from crashbench.errors import ServerUnavailable
from crashbench.results import Result, environment, now_iso
from crashbench.runner import CrashRun, Progress, StopFlag, cleanup_keys
from crashbench.scenario import Scenario
from crashbench.server import open_server

BUILTIN_ORDER = ("naive", "reliable", "stream")


def run_designs(
    scenario: Scenario,
    designs: Sequence[str],
    *,
    redis_url: str | None = None,
    server_binary: str | None = None,
    keep: bool = False,
    progress: Callable[[Progress], None] | None = None,
    stop: StopFlag | None = None,
    kind: str = "run",
) -> Result:
    """Run each design on the scenario and return the typed result. Raises CrashbenchError subclasses."""
    for spec in designs:
        load_design(spec)  # an unknown design is a usage error before any server starts
    run_id = secrets.token_hex(4)
    with open_server(redis_url, server_binary) as server:
        runs = []
        try:
            for spec in designs:
                crash = CrashRun(scenario, spec, server.url, run_id, progress=progress, stop=stop, keep_dir=keep)
                runs.append(crash.execute())
        except redis.ConnectionError as exc:
            raise ServerUnavailable(f"lost the server at {server.url}: {exc}") from None
        finally:
            if server.mode == "external" and not keep:
                # If the server is gone there is nothing left to clean on it.
                with contextlib.suppress(redis.RedisError):
                    cleanup_keys(server.url, f"crashbench:{run_id}:")
        env = environment(server)
    return Result(kind=kind, created=now_iso(), scenario=scenario.to_dict(), runs=runs, environment=env)
