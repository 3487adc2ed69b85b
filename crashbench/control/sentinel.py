"""An embedded Redis Sentinel topology, as production runs automatic failover: one primary, two replicas
and three sentinels, every one a process of crashbench's own (issue 30's first part; the faults and the
clients that follow the primary through Sentinel build on it).

    primary     the server binary on a free port of 127.0.0.1, no persistence
    replicas    two, --replicaof the primary, in sync before the sentinels start
    sentinels   three, the same binary with `--sentinel` (valkey-server's where redis-server is absent),
                each with a config file of its own in its work directory (Sentinel rewrites it as it
                learns the topology), monitoring MASTER_NAME with a quorum of QUORUM

The sentinels decide a failover on their own: a primary that answers nothing for DOWN_AFTER_MS is
subjectively down, and once QUORUM sentinels agree, one of them promotes a replica (`+switch-master`).
`primary_address` asks a sentinel which primary it names now, as a client configured with Sentinel does.

Every process is started in its own session, dies with crashbench (die_with_parent), and is stopped and
its directory removed when the `sentinel_topology` context ends, however it ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from crashbench.control.server import EmbeddedServer, find_server_binary
from crashbench.errors import ServerUnavailable

MASTER_NAME = "crashbench"  # the name clients ask the sentinels for (Celery's master_name, RQ's service)
QUORUM = 2  # of 3: a failover needs two sentinels to agree the primary is down
DOWN_AFTER_MS = 1000  # Sentinel's down-after-milliseconds (its default, 30 s, would outlast a crash test)
FAILOVER_TIMEOUT_MS = 5000  # Sentinel's failover-timeout (its default is 3 minutes)
READY_TIMEOUT_S = 30.0  # for the sentinels to find the replicas and each other (hello messages every 2 s)


class EmbeddedSentinel(EmbeddedServer):
    """One sentinel process: the server binary in sentinel mode, with its own config file."""

    def __init__(self, binary: Path, primary_port: int) -> None:
        super().__init__(binary)
        self.primary_port = primary_port

    def _args(self, log: Path) -> list[str]:
        conf = self.dir / "sentinel.conf"
        if conf.exists():  # a restart: the file as Sentinel rewrote it, with what it learned of the topology
            return [str(self.binary), str(conf), "--sentinel"]
        lines = [
            f"port {self.port}", "bind 127.0.0.1", f"dir {self.dir}", f"logfile {log}", "daemonize no",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary_port} {QUORUM}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
        ]  # fmt: skip
        conf.write_text("\n".join(lines) + "\n")
        return [str(self.binary), str(conf), "--sentinel"]


class SentinelTopology:
    """The processes of one topology; `primary` is the one crashbench started as primary (after a failover,
    `primary_address` says which one the sentinels name)."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.primary = EmbeddedServer(binary)
        self.replicas: list[EmbeddedServer] = []
        self.sentinels: list[EmbeddedSentinel] = []
        self._asking: dict[int, redis.Redis] = {}  # one connection per sentinel, kept: asked every tick of an outage

    @property
    def servers(self) -> list[EmbeddedServer]:
        return [self.primary, *self.replicas]

    @property
    def processes(self) -> list[EmbeddedServer]:
        return [*self.servers, *self.sentinels]

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        """What a client configured with Sentinel is told: the sentinels and the master's name."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def start(self) -> None:
        self.primary.start()
        for _ in range(2):
            replica = EmbeddedServer(self.binary, replica_of=self.primary.port)
            self.replicas.append(replica)
            replica.start()
        for replica in self.replicas:
            _until(lambda r=replica: _info(r.url, "replication").get("master_link_status") == "up",
                   f"the replica on port {replica.port} to sync with its primary")  # fmt: skip
        for _ in range(3):
            sentinel = EmbeddedSentinel(self.binary, self.primary.port)
            self.sentinels.append(sentinel)
            sentinel.start()
        for sentinel in self.sentinels:
            what = f"the sentinel on port {sentinel.port} to find the replicas and the other sentinels"
            _until(lambda s=sentinel: _knows_everyone(s.url), what)

    def primary_address(self) -> tuple[str, int]:
        """The primary the sentinels name now (the first that answers), as a Sentinel client asks for it."""
        for sentinel in self.sentinels:
            client = self._asking.get(sentinel.port)
            if client is None:
                client = redis.Redis.from_url(sentinel.url, decode_responses=True, socket_timeout=2)
                self._asking[sentinel.port] = client
            try:
                host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                return str(host), int(port)
            except (redis.ConnectionError, redis.TimeoutError, TypeError):
                continue  # a killed sentinel; None when it does not know the name
        raise ServerUnavailable("no sentinel of the topology answers")

    def stop(self) -> None:
        for client in self._asking.values():
            client.close()
        for process in reversed(self.processes):  # the sentinels first: none fails over a primary being stopped
            process.stop()


@contextlib.contextmanager
def sentinel_topology(binary: str | None = None) -> Iterator[SentinelTopology]:
    """A topology started and in place (the sentinels know both replicas and each other), stopped on exit."""
    topology = SentinelTopology(find_server_binary(binary))
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


def _info(url: str, section: str) -> dict[str, object]:
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=2)
    try:
        return dict(client.info(section))
    finally:
        client.close()


def _knows_everyone(url: str) -> bool:
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=2)
    try:
        master = client.sentinel_master(MASTER_NAME)
        return int(master.get("num-slaves", 0)) == 2 and int(master.get("num-other-sentinels", 0)) == 2
    finally:
        client.close()


def _until(ready: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Until `ready()` is true (a state the servers reach on their own), at most `timeout`."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise ServerUnavailable(f"timed out waiting for {what} ({timeout:.0f} s)")
        time.sleep(0.05)
