"""The server a session runs on: the user's (--redis-url, a Sentinel's too), a private embedded one, a
private Redis Cluster (--cluster) of embedded servers, or a private Sentinel topology (--sentinel);
stopped and removed when the session ends. Above crashbench.control.server, .cluster and .sentinel,
which it chooses between."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import redis
from redis.sentinel import MasterNotFoundError

from crashbench.control import connect
from crashbench.control.cluster import EmbeddedCluster
from crashbench.control.sentinel import sentinel_topology
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
    sentinel: bool = False,
) -> Iterator[tuple[ServerInfo, EmbeddedCluster | None]]:
    """The server for a session: the one at `redis_url`, or a private one (with `persistence`) stopped
    on exit; with `cluster` (primaries, replicas per primary), a private cluster, its bus behind the
    fault proxy if `partitionable`. Yields the server and, for a private cluster, the cluster itself
    (which a cluster fault may fault: crashbench.faults.cluster). With `sentinel`, a private Sentinel
    topology: the server is its primary, and the workers are told its sentinels (ServerInfo.workers_url);
    so too for a `redis+sentinel://` URL, whose primary is the one its sentinels name at the start."""
    if sentinel:
        if redis_url or cluster is not None:
            raise UsageError(
                "--sentinel starts a private Sentinel topology, "
                f"{'--cluster a cluster' if cluster else '--redis-url names a server'}: give one of them",
                hint="an external Sentinel: --redis-url redis+sentinel://host:port[,host:port]/master-name",
            )
        with sentinel_topology(binary) as topology:
            assert topology.primary.proc is not None
            info = describe(topology.primary.url, "sentinel", str(topology.binary))
            pid, sentinels = topology.primary.proc.pid, len(topology.sentinels)
            yield dataclasses.replace(info, pid=pid, workers_url=topology.url, sentinels=sentinels), None
        return
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
        try:
            if connect.is_sentinel(redis_url):
                info = _behind_sentinel(redis_url)
            else:
                connect.check_database(redis_url)
                info = describe(redis_url, "external", None)
        except MasterNotFoundError:  # no sentinel answers, or none knows the name (a ConnectionError too)
            raise ServerUnavailable(
                f"no sentinel of {redact_url(redis_url)} names a primary of that name",
                hint="check the sentinels' addresses (they must answer) and the master name: "
                "redis+sentinel://host:port[,host:port]/master-name",
            ) from None
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
        except ValueError as exc:  # redis-py's complaint about a malformed URL (ours, for a Sentinel URL)
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


def _behind_sentinel(url: str) -> ServerInfo:
    """An external Sentinel's primary, as its sentinels name it now, for the harness; its sentinels for the
    workers."""
    primary = connect.sentinel_primary_url(url)
    connect.check_database(primary)
    info = describe(primary, "external-sentinel", None)
    return dataclasses.replace(info, workers_url=url, sentinels=len(connect.parse_sentinel(url).sentinels))
