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

A split brain needs a partition between the primary and everyone else, and clients on both sides of it.
With `partitionable`, the topology puts the network fault proxy (crashbench.control.proxy) in front of the
primary: the sentinels monitor it at the proxy's address and the replicas replicate through it, so every
party of the majority knows the primary only there, and clients that ask the sentinels are told that
address. A client given the primary's own port (`primary.url`) is on the primary's side of the partition.
`cut` makes the partition silent, as dropped packets are (the proxy's timeout toxic: connections stay
open and nothing goes through, so the primary sees its replicas' acknowledgements stop rather than their
connections close); `heal` resets what it held open and lets new connections through again.
`min_replicas` sets min-replicas-to-write and min-replicas-max-lag on every server (a replica promoted
keeps it).

Every process is started in its own session, dies with crashbench (die_with_parent), and is stopped and
its directory removed when the `sentinel_topology` context ends, however it ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from crashbench.control.proxyctl import ProxyProcess
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

    def __init__(self, binary: Path, partitionable: bool = False, min_replicas: tuple[int, int] = (0, 10)) -> None:
        self.binary = binary
        self.primary = EmbeddedServer(binary)
        self.replicas: list[EmbeddedServer] = []
        self.sentinels: list[EmbeddedSentinel] = []
        self._asking: dict[int, redis.Redis] = {}  # one connection per sentinel, kept: asked every tick of an outage
        self.partitionable = partitionable
        self.min_replicas = min_replicas  # (min-replicas-to-write, min-replicas-max-lag in s); 0 to write: off
        self.proxy: ProxyProcess | None = None  # in front of the primary, when partitionable
        self.cut_off = False

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

    @property
    def monitored_port(self) -> int:
        """The port the sentinels and the replicas know the primary at: the proxy's, when partitionable."""
        return self.proxy.ports[0] if self.proxy is not None else self.primary.port

    def direct(self, address: tuple[str, int]) -> tuple[str, int]:
        """An address the sentinels name, as the harness reaches it: the primary's own port for the proxy's
        (the harness stands outside any partition)."""
        if self.proxy is not None and address == ("127.0.0.1", self.proxy.ports[0]):
            return "127.0.0.1", self.primary.port
        return address

    def start(self) -> None:
        self.primary.start()
        if self.partitionable:
            self.proxy = ProxyProcess([("127.0.0.1", self.primary.port)], self.primary.dir / "proxy.log")
        for _ in range(2):
            replica = EmbeddedServer(self.binary, replica_of=self.monitored_port)
            self.replicas.append(replica)
            replica.start()
        for replica in self.replicas:
            _until(lambda r=replica: _info(r.url, "replication").get("master_link_status") == "up",
                   f"the replica on port {replica.port} to sync with its primary")  # fmt: skip
        if self.min_replicas[0]:
            for server in self.servers:
                _config(server.url, "min-replicas-max-lag", self.min_replicas[1])
                _config(server.url, "min-replicas-to-write", self.min_replicas[0])
        for _ in range(3):
            sentinel = EmbeddedSentinel(self.binary, self.monitored_port)
            self.sentinels.append(sentinel)
            sentinel.start()
        for sentinel in self.sentinels:
            what = f"the sentinel on port {sentinel.port} to find the replicas and the other sentinels"
            _until(lambda s=sentinel: _knows_everyone(s.url), what)

    def primary_address(self) -> tuple[str, int]:
        """The primary the sentinels name now (the first that answers), as a Sentinel client asks for it."""
        for sentinel in self.sentinels:
            if (named := self._ask(sentinel)) is not None:
                return named
        raise ServerUnavailable("no sentinel of the topology answers")

    def named(self) -> list[tuple[str, int]]:
        """The primary each sentinel that answers names now (after a failover, the one that led it first)."""
        return [named for sentinel in self.sentinels if (named := self._ask(sentinel)) is not None]

    def _ask(self, sentinel: EmbeddedSentinel) -> tuple[str, int] | None:
        client = self._asking.get(sentinel.port)
        if client is None:
            client = redis.Redis.from_url(sentinel.url, decode_responses=True, socket_timeout=2)
            self._asking[sentinel.port] = client
        try:
            host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            return str(host), int(port)
        except (redis.ConnectionError, redis.TimeoutError, TypeError):
            return None  # a killed sentinel; None when it does not know the name

    def cut(self) -> None:
        """The primary cut off from everyone who reaches it through the proxy (sentinels, replicas, clients
        told its address by the sentinels), silently: open connections stay open and carry nothing, new ones
        are accepted and carry nothing. Clients of its own port are on its side and go on."""
        assert self.proxy is not None, "a topology started partitionable"
        self.proxy.set([0], [{"name": "timeout", "direction": "both", "timeout": 0}])
        self.cut_off = True

    def heal(self) -> None:
        """The partition gone: the connections it held open reset (what they swallowed is not replayed: a
        peer reconnects), new ones go through."""
        assert self.proxy is not None
        self.proxy.set([0], [{"name": "down"}])
        self.proxy.set([0], [])
        self.cut_off = False

    def stop(self) -> None:
        for client in self._asking.values():
            client.close()
        try:
            for sentinel in reversed(self.sentinels):  # first: none fails over a primary being stopped
                sentinel.stop()
        finally:
            try:
                if self.proxy is not None:
                    self.proxy.close()
            finally:
                for server in reversed(self.servers):
                    server.stop()


@contextlib.contextmanager
def sentinel_topology(
    binary: str | None = None, partitionable: bool = False, min_replicas: tuple[int, int] = (0, 10)
) -> Iterator[SentinelTopology]:
    """A topology started and in place (the sentinels know both replicas and each other), stopped on exit."""
    topology = SentinelTopology(find_server_binary(binary), partitionable, min_replicas)
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


def _config(url: str, name: str, value: int) -> None:
    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        client.config_set(name, value)
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
