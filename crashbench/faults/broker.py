"""Faults of the server itself (scenario section [broker]), on servers crashbench started only.

    kill      SIGKILL the server mid-run; after `downtime` start it again on the same port and data
              directory, so it comes back with what its persistence mode kept (none, rdb, aof-*).
    failover  a primary with one replica: SIGKILL the primary, REPLICAOF NO ONE on the replica, and
              point everyone at it (the runner re-creates its client; workers re-read the address
              file on their next connection error). With `replica_lag` the replica stops following
              the primary that long before, so what the primary acknowledged meanwhile never reaches
              it (asynchronous replication, behind a partition). With failover_address "kept" the
              promoted replica takes over the primary's port instead (a managed endpoint, a virtual
              IP): clients that never re-read an address (a library's workers) reconnect to it.

With a broker fault the producer (crashbench.run.producer) enqueues during the run, so some enqueues
meet the fault. Workers, producer and runner ride out the downtime by retrying their connection
(bounded; see worker.RECONNECT_S).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from crashbench.control import workdirs
from crashbench.control.connect import DOWN
from crashbench.control.server import EmbeddedServer, find_server_binary
from crashbench.errors import ServerUnavailable
from crashbench.faults.family import Producer


class Broker:
    """The embedded server(s) of one crash run, which the run may kill, restart or fail over."""

    def __init__(
        self, primary: EmbeddedServer, replica: EmbeddedServer | None, url_file: Path, keep_address: bool = False
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.url_file = url_file
        self.keep_address = keep_address  # failover_address "kept"
        self.url_file.write_text(primary.url)

    @property
    def url(self) -> str:
        return self.url_file.read_text().strip()

    def kill(self) -> None:
        self.primary.kill()

    def restart(self) -> None:
        self.primary.restart()

    def cut_replica(self) -> None:
        """The replica stops following the primary: what the primary acknowledges from now on never
        reaches it, as behind a partition. (Pausing the replica would not do: what the primary sent
        waits in the replica's socket buffer and is applied once it resumes.)"""
        assert self.replica is not None
        self.sync_replica()
        self._promote(self.replica)

    def pause_writes(self, ms: int = 2000) -> None:
        """Every client's writes wait on the primary (crashbench.faults.broker.pause_writes)."""
        pause_writes(self.primary.url, ms)

    def sync_replica(self) -> None:
        """Until the replica confirms every write the primary acknowledged so far (the harness's own
        WAIT, bounded), so that a cut made next is exact: what the primary acknowledges from then on,
        and only that, misses the replica."""
        _command(self.primary.url, "WAIT", 1, 1000)

    def relink_replica(self, port: int) -> None:
        """The replica follows the primary through 127.0.0.1:`port` (the network fault proxy's
        replica-link slot) from now on; returns once it is in sync again."""
        assert self.replica is not None
        _command(self.replica.url, "REPLICAOF", "127.0.0.1", port)
        _wait_in_sync(self.replica.url)
        self.sync_replica()

    def failover(self) -> None:
        """Kill the primary and promote the replica; the address file then names the replica. With
        keep_address the replica first moves to the primary's port (CONFIG SET port, Redis 7's live
        rebind; the dead primary freed it): a client reconnecting to the old address reaches it."""
        assert self.replica is not None
        self.primary.kill()
        self._promote(self.replica)
        if self.keep_address:
            _command(self.replica.url, "CONFIG", "SET", "port", self.primary.port)
            self.replica.port = self.primary.port
        self.primary, self.replica = self.replica, None
        self.url_file.write_text(self.primary.url)

    @staticmethod
    def _promote(server: EmbeddedServer) -> None:
        _command(server.url, "REPLICAOF", "NO", "ONE")


class ReplicaCut:
    """The replica cut off `lag` seconds before a broker fault is due, and from then on the producer's
    enqueues marked lagging (what a failover may lose), until the fault's own code says the producer
    writes to the promoted replica: one schedule for both kinds of broker fault
    (crashbench.faults.injector on one server, crashbench.faults.cluster on a cluster's shard). The
    fault comes `lag` after the cut took effect at the earliest: on a loaded machine the cut itself may
    take longer than the lag, which would leave no time for an enqueue the replica never gets."""

    def __init__(
        self, cut: Callable[[], None], producer: Producer, lag: float, mark: Callable[[float, str], None],
        clock: Callable[[], float],
    ) -> None:  # fmt: skip
        self.cut, self.producer, self.lag, self.mark, self.clock = cut, producer, lag, mark, clock
        self.done = not lag
        self.at: float | None = None  # when the cut took effect

    def step(self, now: float, due: float) -> float:
        """Cut the replica once it is time; when the fault is due (`due`, or `lag` after the cut)."""
        if not self.done and now >= due - self.lag:
            self.cut()
            self.at = self.clock()
            self.mark(self.at, "replica_cut")
            self.producer.lagging = True
            self.done = True
        return due if self.at is None else max(due, self.at + self.lag)


def pause_writes(url: str, ms: int = 2000) -> None:
    """Every client's writes to the server at `url` wait (CLIENT PAUSE WRITE, reads go on) for at most
    `ms`: the reading taken next is a snapshot. Called just before the server's fault, which ends the pause."""
    _command(url, "CLIENT", "PAUSE", ms, "WRITE")


def _command(url: str, *args: str | int) -> None:
    """One command of the harness's to a server of the run, on a connection of its own."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.execute_command(*args)
    finally:
        client.close()


def wait_back(url: str, timeout: float = 30.0) -> None:
    """Until the server at `url` answers PING (it may be loading its data)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=0.2, socket_timeout=1)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if client.ping():
                    return
            except DOWN:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
    finally:
        client.close()


@contextlib.contextmanager
def broker_servers(fault: str, persistence: str, binary: str | None, keep_address: bool = False) -> Iterator[Broker]:
    """A private server with the scenario's persistence for one crash run (and a replica for a
    failover, in sync before the run starts); everything stopped and removed on exit."""
    path = find_server_binary(binary)
    home = workdirs.make("broker")
    servers: list[EmbeddedServer] = []
    try:
        primary = EmbeddedServer(path, persistence)
        servers.append(primary)
        primary.start()
        replica = None
        if fault == "failover":
            replica = EmbeddedServer(path, persistence, replica_of=primary.port)
            servers.append(replica)
            replica.start()
            _wait_in_sync(replica.url)
        yield Broker(primary, replica, home / "server.url", keep_address)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(home, ignore_errors=True)


def _wait_in_sync(url: str, timeout: float = 30.0) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    deadline = time.monotonic() + timeout
    try:
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"the replica at {url} did not sync with its primary in {timeout:.0f} s")
            time.sleep(0.02)
    finally:
        client.close()
