"""The server a session runs on: the user's (--redis-url), a private embedded one, or a private
Redis Cluster (--cluster) of embedded servers; stopped and removed when the session ends.
Above both crashbench.control.server and crashbench.control.cluster, which it chooses between."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import redis

from crashbench.control import connect
from crashbench.control.cluster import EmbeddedCluster
from crashbench.control.server import EmbeddedServer, describe, find_server_binary
from crashbench.errors import ServerUnavailable, UsageError
from crashbench.model.server import ServerInfo
from crashbench.redact import redact_text, redact_url


@contextlib.contextmanager
def open_server(
    redis_url: str | None = None,
    binary: str | None = None,
    persistence: str = "none",
    cluster: tuple[int, int] | None = None,
    partitionable: bool = False,
) -> Iterator[tuple[ServerInfo, EmbeddedCluster | None]]:
    """The server for a session: the one at `redis_url`, or a private one (with `persistence`) stopped
    on exit; with `cluster` (primaries, replicas per primary), a private cluster, its bus behind the
    fault proxy if `partitionable`. Yields the server and, for a private cluster, the cluster itself
    (which a cluster fault may fault: crashbench.faults.cluster)."""
    if cluster is not None:
        if redis_url:
            raise UsageError(
                "--cluster starts a private cluster, --redis-url names a server: give one of them",
                hint="leave out --redis-url (and unset CRASHBENCH_REDIS_URL and REDIS_URL), or --cluster",
            )
        embedded = EmbeddedCluster(find_server_binary(binary), *cluster, partitionable=partitionable)
        try:
            embedded.start()
            yield describe(embedded.url, "embedded", str(embedded.binary)), embedded
        finally:
            embedded.stop()
        return
    if redis_url:
        if connect.is_sentinel(redis_url):  # crashbench.control.sentinel's topology comes first (issue 30)
            raise UsageError(
                "a run on a Sentinel URL (redis+sentinel://) is not supported yet",
                hint="give the current primary's redis:// URL",
            )
        try:
            connect.check_database(redis_url)
            info = describe(redis_url, "external", None)
        except redis.AuthenticationError as exc:  # a ConnectionError too: caught first, for its own hint
            raise ServerUnavailable(
                f"{redact_url(redis_url)} refused the credentials: {redact_text(str(exc), redis_url)}",
                hint="check the user and password in --redis-url (or CRASHBENCH_REDIS_URL / REDIS_URL)",
            ) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ServerUnavailable(
                # redis-py's own texts name host and port, not the password; scrubbed all the same.
                f"cannot reach {redact_url(redis_url)}: {redact_text(str(exc), redis_url)}",
                hint="start that server, fix --redis-url (or CRASHBENCH_REDIS_URL / REDIS_URL), "
                "or leave it out to use a private embedded server",
            ) from None
        except ValueError as exc:  # redis-py's complaint about a malformed URL
            raise ServerUnavailable(
                f"bad --redis-url {redact_url(redis_url)!r}: {redact_text(str(exc), redis_url)}"
            ) from None
        yield info, None
        return
    server = EmbeddedServer(find_server_binary(binary), persistence)
    try:
        server.start()
        assert server.proc is not None
        yield dataclasses.replace(describe(server.url, "embedded", str(server.binary)), pid=server.proc.pid), None
    finally:
        server.stop()
