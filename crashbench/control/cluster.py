"""An embedded Redis Cluster: N primaries, each with R replicas, on loopback ports, from the same server
binary as the embedded server (crashbench.control.server), set up with nothing but the server's own
CLUSTER commands.

Every node is an EmbeddedServer (its own temporary directory, persistence off, its own session, dying
with crashbench, stopped and removed at exit) with `cluster-enabled yes` and a cluster bus port of
its own. Setting up: each primary gets an even share of the 16384 slots (CLUSTER ADDSLOTSRANGE) and
every node a distinct config epoch before any two meet, so no epoch collision has to be resolved;
every node MEETs every other (all pairs: nobody has to wait for gossip to learn of a third node);
each replica REPLICATEs its primary once it knows it; then every node must report cluster_state:ok
with all slots and every primary in it, and every replica its link to its primary up.

A partitionable cluster (the cluster-partition fault, crashbench.faults.cluster) has its bus links go
through the network fault proxy: every node's bus port has a proxy slot in front of it, which the node
announces (cluster-announce-bus-port; cluster-announce-ip 127.0.0.1, so that peers do not take its
source address for its own), and every node connects from an address of its own, 127.0.0.<2 + i>
(bind-source-addr), so that the proxy can tell whose link it forwards: `cut` resets every link between
one node and the others, both ways (its bus, and its replication link when it is a replica or has one).
Client connections stay direct: a cut-off primary keeps its clients, as in a real partition.

How long that takes is mostly the server's own floor: a primary turns its state ok no sooner than
2 s after it starts (CLUSTER_WRITABLE_DELAY in the server's source, not configurable), so a cluster
is ready about 2.1 s after its nodes start; the handshakes take a few hundred ms within that.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import redis

from crashbench.control import workdirs
from crashbench.control.connect import cluster_nodes
from crashbench.control.proxyctl import ProxyProcess
from crashbench.control.server import EmbeddedServer, free_port
from crashbench.errors import ServerUnavailable

SLOTS = 16384
# Failure detection (a node unreachable this long is suspected) and, below it, how often every pair of
# nodes pings at least (half of it). The stock 15 s would make a failover test wait that long; far
# lower would have a node of a loaded 2-core machine suspected while it is only slow to answer.
NODE_TIMEOUT_MS = 2000
READY_TIMEOUT_S = 20.0


class ClusterNode(EmbeddedServer):
    """One node: the embedded server's arguments plus cluster mode and a bus port, picked anew at each
    start attempt (the server's own default, port + 10000, may be above 65535 or taken)."""

    def __init__(self, binary: Path) -> None:
        super().__init__(binary)
        self.bus_port = 0
        # Behind the bus proxy: (the address it connects from, the bus port it announces, the proxy's).
        self.proxied: tuple[str, int] | None = None

    def _args(self, log: Path) -> list[str]:
        if self.proxied is None:  # a restart behind the proxy keeps the bus port the proxy forwards to
            self.bus_port = free_port()
            while self.bus_port == self.port:
                self.bus_port = free_port()
        args = super()._args(log)
        args += ["--cluster-enabled", "yes", "--cluster-port", str(self.bus_port)]
        args += ["--cluster-config-file", str(self.dir / "nodes.conf"), "--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
        if self.proxied is not None:
            args += [f"--{name}" for name in self._announce()]
        return args

    def _announce(self) -> list[str]:
        """The settings behind the bus proxy, as name, value, name, value..."""
        assert self.proxied is not None
        source, port = self.proxied
        # protected-mode: a server without a password takes clients from 127.0.0.1 alone, and a replica
        # connects from its own address. It still listens on 127.0.0.1 only (EmbeddedServer's --bind).
        return [
            "bind-source-addr", source, "cluster-announce-ip", "127.0.0.1", "cluster-announce-bus-port", str(port),
            "protected-mode", "no",
        ]  # fmt: skip

    def put_behind(self, source: str, proxy_port: int) -> None:
        """From now on it connects from `source` and announces the proxy's port as its bus port."""
        self.proxied = (source, proxy_port)
        client = self.client()
        try:
            client.execute_command("CONFIG", "SET", *self._announce())
        finally:
            client.close()

    @property
    def source(self) -> str:
        return self.proxied[0] if self.proxied is not None else "127.0.0.1"

    @property
    def announced_bus_port(self) -> int:
        return self.proxied[1] if self.proxied is not None else self.bus_port

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5)


def slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """The slots split evenly, as inclusive ranges: the first primaries take one more when it does not divide."""
    share, extra = divmod(SLOTS, primaries)
    ranges, start = [], 0
    for i in range(primaries):
        end = start + share + (1 if i < extra else 0)
        ranges.append((start, end - 1))
        start = end
    return ranges


class EmbeddedCluster:
    def __init__(self, binary: Path, primaries: int = 3, replicas: int = 0, partitionable: bool = False) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError(f"a cluster needs at least one primary and no negative replicas ({primaries}, {replicas})")
        self.binary = binary
        self.primaries = primaries
        self.replicas = replicas  # per primary
        self.nodes = [ClusterNode(binary) for _ in range(primaries * (1 + replicas))]
        self.started_s = 0.0  # how long start() took
        self.partitionable = partitionable
        self.bus_proxy: ProxyProcess | None = None
        self.cut_off: ClusterNode | None = None

    @property
    def url(self) -> str:
        """The cluster's URL: its first primary, which the client asks for the rest (crashbench.control.connect)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def primary_nodes(self) -> list[ClusterNode]:
        return self.nodes[: self.primaries]

    def replica_nodes(self) -> list[tuple[ClusterNode, ClusterNode]]:
        """(replica, its primary): replica j of primary i is node primaries + i * replicas + j."""
        return [
            (self.nodes[self.primaries + i * self.replicas + j], self.nodes[i])
            for i in range(self.primaries)
            for j in range(self.replicas)
        ]

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start every node and set the cluster up; on any failure, stop whatever was started."""
        began = time.monotonic()
        try:
            for node in self.nodes:
                node.start()
            if self.partitionable:
                self._proxy_the_bus()
            self._assemble(began + timeout, timeout)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began

    def _assemble(self, deadline: float, timeout: float) -> None:
        clients = [node.client() for node in self.nodes]
        try:
            ids = [c.execute_command("CLUSTER", "MYID") for c in clients]
            for i, (first, last) in enumerate(slot_ranges(self.primaries)):
                clients[i].execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for epoch, c in enumerate(clients, start=1):
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)  # refused once a node knows another
            for i, c in enumerate(clients):
                for other in self.nodes[i + 1 :]:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port, other.announced_bus_port)
            if self.replicas:
                self._wait(deadline, timeout, "every node to know every other", lambda: self._all_known(clients, ids))
                for replica, primary in self.replica_nodes():
                    clients[self.nodes.index(replica)].execute_command(
                        "CLUSTER", "REPLICATE", ids[self.nodes.index(primary)]
                    )
            self._wait(deadline, timeout, "cluster_state:ok on every node", lambda: self._problem(clients))
        finally:
            for c in clients:
                c.close()

    def _all_known(self, clients: list[redis.Redis], ids: list[str]) -> str | None:
        for node, c in zip(self.nodes, clients, strict=True):
            known = {n.id for n in cluster_nodes(c) if "handshake" not in n.flags and "noaddr" not in n.flags}
            if missing := set(ids) - known:
                return f"127.0.0.1:{node.port} does not know {len(missing)} node(s) yet"
        return None

    def _problem(self, clients: list[redis.Redis]) -> str | None:
        """What keeps the cluster from being ready, or None: every node ok with every slot and primary,
        the replicas known to every node as such, and each replica's link to its primary up."""
        want_replicas = self.primaries * self.replicas
        for node, c in zip(self.nodes, clients, strict=True):
            info = c.cluster("info")
            where = f"127.0.0.1:{node.port}"
            if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != SLOTS:
                return f"{where} reports cluster_state:{info.get('cluster_state')}"
            if int(info.get("cluster_size", 0)) != self.primaries:
                return f"{where} knows {info.get('cluster_size')} of {self.primaries} primaries"
            if sum(1 for n in cluster_nodes(c) if "slave" in n.flags) != want_replicas:
                return f"{where} does not list every replica yet"
        for replica, _ in self.replica_nodes():
            c = clients[self.nodes.index(replica)]
            if c.info("replication").get("master_link_status") != "up":
                return f"replica 127.0.0.1:{replica.port}: link to its primary not up"
        return None

    def _wait(self, deadline: float, timeout: float, what: str, problem: Callable[[], str | None]) -> None:
        last = None
        while time.monotonic() < deadline:
            if (last := problem()) is None:
                return
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise ServerUnavailable(f"cluster node 127.0.0.1:{node.port} exited while the cluster was set up")
            time.sleep(0.02)
        raise ServerUnavailable(
            f"the embedded cluster ({self.primaries} primaries, {self.replicas} replica(s) each) was not ready "
            f"after {timeout:g} s: waiting for {what}: {last}",
            hint="a node's log is in its directory while it runs; check the machine's load, or use --redis-url",
        )

    def _proxy_the_bus(self) -> None:
        self._proxy_home = workdirs.make("busproxy")
        targets = [("127.0.0.1", node.bus_port) for node in self.nodes]
        self.bus_proxy = ProxyProcess(targets, self._proxy_home / "proxy.log")
        for i, (node, port) in enumerate(zip(self.nodes, self.bus_proxy.ports, strict=True)):
            node.put_behind(f"127.0.0.{2 + i}", port)

    def cut(self, node: ClusterNode) -> None:
        """Every link between `node` and the other nodes reset, and refused from now on, both ways."""
        if self.bus_proxy is None:
            raise RuntimeError("this cluster was not started partitionable: its bus is not proxied")
        index = self.nodes.index(node)
        others = [n.source for n in self.nodes if n is not node]
        self.bus_proxy.set([index], [{"name": "down", "peers": others}])
        rest = [i for i in range(len(self.nodes)) if i != index]
        self.bus_proxy.set(rest, [{"name": "down", "peers": [node.source]}])
        self.cut_off = node

    def mend(self) -> None:
        """The cut healed: the nodes reconnect by themselves (the bus every 100 ms or so)."""
        if self.bus_proxy is not None and self.cut_off is not None:
            self.bus_proxy.set(list(range(len(self.nodes))), [])
            self.cut_off = None

    def stop(self) -> None:
        """Stop every node and remove its directory. SIGTERM goes to all first, so they shut down
        together rather than one after the other."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(OSError):
                    node.proc.terminate()
        for node in self.nodes:
            node.stop()
        if self.bus_proxy is not None:
            self.bus_proxy.close()
            shutil.rmtree(self._proxy_home, ignore_errors=True)
