"""Faults of the server itself (scenario section [broker]), on servers crashbench started only.

    kill      SIGKILL the server mid-run; after `downtime` start it again on the same port and data
              directory, so it comes back with what its persistence mode kept (none, rdb, aof-*).
    failover  a primary with one replica: SIGKILL the primary, REPLICAOF NO ONE on the replica, and
              point everyone at it (the runner re-creates its client; workers re-read the address
              file on their next connection error). With `replica_lag` the replica stops following
              the primary that long before, so what the primary acknowledged meanwhile never reaches
              it (asynchronous replication, behind a partition).

With a broker fault the producer enqueues during the run (`produce_s`), ten jobs per call, so some
enqueues meet the fault: one that returned is *acknowledged*; one that raised, timed out, or was not
replicated in time (WAIT) is *indeterminate* (Jepsen's word) and never retried. Workers, producer and
runner ride out the downtime by retrying their connection (bounded; see worker.RECONNECT_S).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from crashbench.designs import Design
from crashbench.errors import ServerUnavailable
from crashbench.model.queue import DesignSettings, EnqueueUnconfirmed, Job, Receipts, receipts
from crashbench.run import workdirs
from crashbench.run.server import EmbeddedServer, find_server_binary
from crashbench.run.worker import DOWN

CHUNK = 10  # jobs per enqueue call while producing during the run
PRODUCER_TIMEOUT = 5.0  # s: the producer's connection through the proxy when the scenario sets no socket timeout


def producer_bound(socket_timeout: float) -> float:
    """How long the harness waits for one enqueue through the proxy (Through): a built-in design's
    gives up after its timeout, twice over with a reconnect, so this never cuts one short."""
    return 2 * (socket_timeout or PRODUCER_TIMEOUT) + 0.5


class Broker:
    """The embedded server(s) of one crash run, which the run may kill, restart or fail over."""

    def __init__(self, primary: EmbeddedServer, replica: EmbeddedServer | None, url_file: Path) -> None:
        self.primary = primary
        self.replica = replica
        self.url_file = url_file
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
        """Every client's writes wait (CLIENT PAUSE WRITE, reads go on) for at most `ms`: the reading
        taken next is a snapshot. Called just before the server's fault, which ends the pause."""
        _command(self.primary.url, "CLIENT", "PAUSE", ms, "WRITE")

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
        """Kill the primary and promote the replica; the address file then names the replica."""
        assert self.replica is not None
        self.primary.kill()
        self._promote(self.replica)
        self.primary, self.replica = self.replica, None
        self.url_file.write_text(self.primary.url)

    @staticmethod
    def _promote(server: EmbeddedServer) -> None:
        _command(server.url, "REPLICAOF", "NO", "ONE")


class Through:
    """The producer's enqueues through the network fault proxy (a fault on the producer), with its own
    design: each in a thread, waited for at most `bound` s. One that has not returned by then is
    indeterminate and abandoned with its design, as Jepsen abandons a client whose operation timed out;
    the next enqueue gets a fresh design. A library's client may have no socket timeout at all, and the
    harness must not hang with it (nor its Ctrl-C). Abandoned calls end when the proxy closes."""

    def __init__(self, fresh: Callable[[], Design], bound: float) -> None:
        self.fresh, self.bound = fresh, bound
        self.designs = [fresh()]
        self.abandoned = 0

    @classmethod
    def to(cls, url: str, design_cls: type[Design], prefix: str, settings: DesignSettings, timeout: float) -> Through:
        """Enqueues of a `design_cls` design through the proxy at `url`."""
        return cls(lambda: design_cls(producer_client(url, timeout), prefix, settings), producer_bound(timeout))

    def enqueue(self, chunk: list[Job]) -> bool:
        design, outcome = self.designs[-1], []

        def call() -> None:
            try:
                design.enqueue(chunk)
            except Exception:  # whatever the library raises: the enqueue got no answer
                outcome.append(False)
            else:
                outcome.append(True)

        thread = threading.Thread(target=call, name="crashbench-producer", daemon=True)
        thread.start()
        thread.join(self.bound)
        if thread.is_alive():
            self.abandoned += 1
            self.designs.append(self.fresh())
            return False
        return outcome[0]

    def close(self) -> None:
        for design in self.designs:
            with contextlib.suppress(Exception):
                design.r.close()


class Producer:
    """Enqueues the run's jobs over `produce_s` seconds, CHUNK at a time, and records each chunk: when,
    its ids, whether its enqueue was acknowledged (else indeterminate), and whether that was while the
    replica lagged. The timeline reads the chunks (crashbench.evidence.timeline). With `through`, its
    enqueues go through the proxy (Through), else through the design it is given."""

    def __init__(
        self,
        ids: Sequence[str],
        jobs: Callable[[Sequence[str]], list[Job]],
        produce_s: float,
        start: float,
        through: Through | None = None,
    ) -> None:
        self.ids = ids
        self.jobs = jobs  # a chunk's ids -> its jobs, made when the chunk is due
        self.through = through
        self.every = produce_s / max(1, -(-len(ids) // CHUNK))
        self.start = start
        self.next = 0
        self.lagging = False  # set once the replica stopped following the primary (replica_lag)
        # (harness clock, ids, acknowledged, lagging, what the enqueue returned: a stream's entry ids)
        self.chunks: list[tuple[float, Sequence[str], bool, bool, Receipts]] = []

    @property
    def done(self) -> bool:
        return self.next >= len(self.ids)

    @property
    def acknowledged(self) -> int:
        """Enqueues acknowledged so far."""
        return sum(len(ids) for _, ids, ok, _, _ in self.chunks if ok)

    def produce(self, design: Design, now: float) -> None:
        """Enqueue the next chunk if it is due by `now`: one per call, so that a slow enqueue (a WAIT
        that times out) holds back the producer, never the runner's loop."""
        if not self.done and now >= self.start + (self.next // CHUNK) * self.every:
            ids = self.ids[self.next : self.next + CHUNK]
            chunk = self.jobs(ids)
            self.next += CHUNK
            entries: Receipts = None
            if self.through is not None:
                ok = self.through.enqueue(chunk)
            else:
                try:
                    entries = receipts(design.enqueue(chunk), ids, design.name)
                except (*DOWN, EnqueueUnconfirmed):
                    ok = False
                else:
                    ok = True
            self.chunks.append((now, ids, ok, ok and self.lagging, entries))


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


def _command(url: str, *args: str | int) -> None:
    """One command of the harness's to a server of the run, on a connection of its own."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.execute_command(*args)
    finally:
        client.close()


def producer_client(url: str, socket_timeout: float) -> redis.Redis:
    """The producer's own connection when a network fault targets it (through the proxy). Always
    bounded, since the producer runs in the harness's loop; and one attempt per enqueue: redis-py
    retries a command that failed on the connection, and a retried enqueue that had landed would
    enqueue the job twice. An enqueue without an answer is recorded indeterminate, never retried."""
    t = socket_timeout or PRODUCER_TIMEOUT
    return redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=t, socket_connect_timeout=t, retry=Retry(NoBackoff(), 0)
    )


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
def broker_servers(fault: str, persistence: str, binary: str | None) -> Iterator[Broker]:
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
        yield Broker(primary, replica, home / "server.url")
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
