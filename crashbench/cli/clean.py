"""`crashbench clean`: list the run namespaces on a server and remove those whose run is gone.

A run on a server crashbench did not start keeps `crashbench:{<run-id>}:alive` while it lives
(crashbench.control.lease); a SIGKILLed run leaves its keys behind until their safety expiry. Only keys under
a run's namespace are ever read or removed; without --yes nothing is removed at all.
"""

from __future__ import annotations

import math

import click
import redis
from redis.exceptions import RedisClusterException
from rich.table import Table

from crashbench.cli import common as base
from crashbench.control import connect
from crashbench.control.lease import Namespace, namespaces
from crashbench.control.server import cleanup_keys
from crashbench.errors import ServerUnavailable
from crashbench.redact import redact_text


def _finite(v: float) -> float:
    if not math.isfinite(v):  # nan passes FloatRange: nan < 0 and nan > max are both false
        raise click.BadParameter(f"{v} is not a number of seconds")
    return v


def _state(entry: Namespace, grace: float) -> str:
    if entry.alive:
        return "alive"
    return "gone" if entry.gone(grace) else f"no alive key, active {entry.idle_s} s ago"


@base.cli.command()
@click.option(
    "--redis-url",
    required=True,
    metavar="URL",
    envvar=("CRASHBENCH_REDIS_URL", "REDIS_URL"),
    help="The server to clean. Also read from CRASHBENCH_REDIS_URL, else REDIS_URL: pass a password that way.",
)
@click.option("--yes", is_flag=True, help="Remove the namespaces whose run is gone (else only list them).")
@click.option(
    "--grace",
    type=click.FloatRange(min=0, max=86_400),
    callback=lambda _ctx, _param, v: _finite(v),
    default=60.0,
    show_default=True,
    help="Seconds: a namespace without an alive key whose keys changed this recently is kept (a run starting).",
)
@base.reports_errors
def clean(redis_url: str, yes: bool, grace: float) -> None:
    """List the crashbench:{<run-id>}: namespaces on a server, their key counts and whether their run is
    alive; with --yes, remove those whose run is gone. No other key is touched."""
    # The URL may carry a password: messages name the server without it.
    try:
        # A cluster (its URL, or a node's plain one) is read primary by primary: a namespace's keys are in
        # its hash tag's slot, a sharded design's also in its shards' slots on other primaries.
        connect.check_database(redis_url)
        redis_url = connect.resolved(redis_url)
        clients = connect.primaries(redis_url, socket_connect_timeout=5, socket_timeout=30)
        router = connect.connect(redis_url, socket_connect_timeout=5, socket_timeout=30)
    except ValueError as exc:
        raise ServerUnavailable(f"bad --redis-url: {redact_text(str(exc), redis_url)}") from None
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
        raise ServerUnavailable(f"cannot reach the server of --redis-url: {type(exc).__name__}") from None
    try:
        listed = namespaces(clients, router)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServerUnavailable(f"cannot reach the server of --redis-url: {type(exc).__name__}") from None
    finally:
        for c in [*clients, router]:
            c.close()
    table = Table(title="crashbench namespaces", title_justify="left")
    for column in ("namespace", "keys", "run", "action"):
        table.add_column(column)
    gone = [e for e in listed if e.gone(grace)]
    for e in listed:
        action = ("removed" if yes else "would remove") if e in gone else "kept"
        table.add_row(e.ns, str(e.keys), _state(e, grace), action)
    if listed:
        base.out.print(table)
    removed = 0
    if yes:
        for e in gone:
            try:
                removed += cleanup_keys(redis_url, e.ns)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise ServerUnavailable(f"lost the server while removing {e.ns}: {type(exc).__name__}") from None
        base.out.print(f"{len(listed)} namespaces; removed {len(gone)} whose run is gone ({removed} keys)")
    else:
        keys = sum(e.keys for e in gone)
        hint = "; run again with --yes to remove them" if gone else ""
        base.out.print(f"{len(listed)} namespaces; {len(gone)} whose run is gone ({keys} keys){hint}")
