"""Faults of a Redis Cluster crashbench started (`--cluster N`), on the shard that holds the run: every
key of a run is in the slot of its hash tag, so one primary and its replica are the run's server.

    cluster-kill        SIGKILL that primary. The cluster itself promotes its replica, once a majority
                        of primaries has seen the primary fail (cluster-node-timeout, FAULT_NODE_TIMEOUT_MS
                        in a fault run) and the replica won their votes; `downtime` s after the promotion
                        the old primary starts again on its port and configuration, and rejoins as a
                        replica of the promoted one.
    cluster-failover    CLUSTER FAILOVER on the replica, the graceful one: the primary stops its clients,
                        the replica catches up with its replication offset, then takes over.
    cluster-failover-force / cluster-takeover
                        CLUSTER FAILOVER FORCE (without the primary's agreement or its offset) and
                        TAKEOVER (without the other primaries' votes either).
    cluster-partition   that primary cut off from every other node (its bus links through the network
                        fault proxy, crashbench.control.cluster; its replica stops applying its stream),
                        while its clients stay connected: it goes on acknowledging their writes until
                        it sees that it lost the majority (cluster-node-timeout), as the others promote
                        its replica; `downtime` s after the promotion the cut heals, and the old primary
                        turns into a replica of the promoted one, throwing away what it alone took.

Clients follow the new topology by themselves (redis-py's RedisCluster: a refused connection or MOVED
reloads the slot map); the address file names the replica, the node that survives, from the start.

The evidence is the harness's own reading of both sides: the primary's, with writes paused, as the
fault strikes (as on one server), or, when it was cut off, as the cut heals (its last state, which it
is about to throw away; read with cluster-allow-reads-when-down, since a primary in the minority
refuses reads too); and the promoted replica's, taken the moment it is promoted and
before any client writes to it: its client writes wait (CLIENT PAUSE WRITE) from the strike until a
watcher thread has read it. A paused replica also stops applying its primary's stream, which is how
`replica_lag` cuts it off before the fault (the primary keeps acknowledging, the replica never applies
it: a partition of the replication link). A graceful failover cannot start from a paused replica (it
waits for the replica to catch up), so it is read by the replication offsets alone.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from crashbench.control import connect, workdirs
from crashbench.control.cluster import ClusterNode, EmbeddedCluster
from crashbench.errors import ServerUnavailable
from crashbench.faults.broker import ReplicaCut
from crashbench.faults.family import Producer
from crashbench.model.faults import JOB_SAMPLE, BrokerFaultRecord, Fault
from crashbench.model.queue import Located
from crashbench.model.timeline import rel

FAILOVER_ARGS = {"cluster-failover": (), "cluster-failover-force": ("FORCE",), "cluster-takeover": ("TAKEOVER",)}
# Failure detection in a fault run: 1 s rather than the embedded cluster's 2 s, since the recovery time
# of a kill is mostly this (a loaded machine's node that is only slow would rarely stay silent 1 s).
FAULT_NODE_TIMEOUT_MS = 1000
PAUSE_MS = 30_000  # the longest the replica's client writes wait for the harness's reading
PROMOTION_TIMEOUT_S = 30.0


class ClusterBroker:
    """The shard of one crash run: the primary that serves `key`'s slot and one of its replicas."""

    def __init__(self, cluster: EmbeddedCluster, key: str, url_file: Path) -> None:
        self.cluster = cluster
        self.primary, self.replica = shard(cluster, key)
        self.url_file = url_file
        # The replica is the node that is still there after the fault: clients made at any time start from it.
        self.url_file.write_text(f"redis+cluster://127.0.0.1:{self.replica.port}")
        for node in cluster.nodes:
            _call(node, "CONFIG", "SET", "cluster-node-timeout", FAULT_NODE_TIMEOUT_MS)
        self.paused = False  # the replica's client writes (and its replication) wait
        self.partitioned = False  # the primary is cut off from the other nodes

    @property
    def url(self) -> str:
        return self.url_file.read_text().strip()

    def offset(self, node: ClusterNode) -> int:
        return int(_info(node)["master_repl_offset"])

    def cut_replica(self) -> None:
        """The replica stops applying its primary's stream from now on, after catching up with
        everything acknowledged so far (by the offsets: a WAIT on a connection of the harness's own,
        which wrote nothing, would return at once), so that what misses it is exactly what the primary
        acknowledges from now on."""
        want, deadline = self.offset(self.primary), time.monotonic() + 5
        while self.offset(self.replica) < want and time.monotonic() < deadline:
            time.sleep(0.002)
        self.pause_replica()

    def pause_replica(self) -> None:
        if not self.paused:
            _call(self.replica, "CLIENT", "PAUSE", PAUSE_MS, "WRITE")
            self.paused = True

    def pause_primary(self) -> int:
        """Every client's writes to the primary wait (reads go on) for at most 2 s: the reading taken
        next is a snapshot. Returns the primary's replication offset, which no longer moves."""
        _call(self.primary, "CLIENT", "PAUSE", 2000, "WRITE")
        return self.offset(self.primary)

    def strike(self, kind: str) -> None:
        if kind == "cluster-partition":
            # Its replica catches up with the paused primary first: what it misses is exactly what the
            # primary acknowledges from the cut on. Then the primary's clients go on.
            self.cut_replica()
            self.cluster.cut(self.primary)
            self.partitioned = True
            _call(self.primary, "CLIENT", "UNPAUSE")
        elif kind == "cluster-kill":
            self.primary.kill()
            self.pause_replica()
        else:
            if kind != "cluster-failover":  # graceful: the replica must go on applying until it caught up
                self.pause_replica()
            _call(self.replica, "CLUSTER", "FAILOVER", *FAILOVER_ARGS[kind])

    def promoted(self) -> bool:
        return _info(self.replica)["role"] == "master"

    def unpause(self) -> None:
        """The promoted replica's clients go on; the old primary's too, where it lives, once it knows
        it is a replica (its clients are then told MOVED): unpaused before, it would take writes that
        the harness's reading at the fault never saw, and lose them with its demotion."""
        _call(self.replica, "CLIENT", "UNPAUSE")
        self.paused = False
        if self.partitioned or self.primary.proc is None or self.primary.proc.poll() is not None:
            return  # a cut-off primary goes on serving its clients until the cut heals (mend)
        deadline = time.monotonic() + 5
        with contextlib.suppress(redis.RedisError):
            while _info(self.primary)["role"] != "slave" and time.monotonic() < deadline:
                time.sleep(0.002)
            _call(self.primary, "CLIENT", "UNPAUSE")

    def last_word(self, read: Callable[[redis.Redis], Located]) -> set[str]:
        """The cut-off primary's writes paused (until it follows the promoted replica: `resume_primary`)
        and what it holds, read as it stands."""
        _call(self.primary, "CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        _call(self.primary, "CONFIG", "SET", "cluster-allow-reads-when-down", "yes")
        reader = redis.Redis(host="127.0.0.1", port=self.primary.port, socket_timeout=10)
        try:
            return set(read(reader).held)
        finally:
            reader.close()
            _call(self.primary, "CONFIG", "SET", "cluster-allow-reads-when-down", "no")

    def resume_primary(self) -> None:
        """The old primary's clients go on (a no-op where the watcher let them go already)."""
        _call(self.primary, "CLIENT", "UNPAUSE")

    def mend(self) -> None:
        self.cluster.mend()
        self.partitioned = False

    def restart_old(self) -> None:
        """The killed primary, again on its port and cluster configuration: it rejoins as a replica."""
        self.primary.restart()
        _call(self.primary, "CONFIG", "SET", "cluster-node-timeout", FAULT_NODE_TIMEOUT_MS)

    def rejoined(self) -> bool:
        """The old primary follows the promoted one, its link up."""
        info = _info(self.primary)
        return info["role"] == "slave" and info.get("master_link_status") == "up"

    def heal(self) -> None:
        """After the run, whatever happened: every node up and unpaused, the old primary a replica in
        sync, so that the session's next run finds a whole shard."""
        if self.partitioned:
            self.mend()
        if self.primary.proc is None or self.primary.proc.poll() is not None:
            self.restart_old()
        for node in (self.replica, self.primary):
            with contextlib.suppress(redis.RedisError):
                _call(node, "CLIENT", "UNPAUSE")
        deadline = time.monotonic() + 20
        while not (self.rejoined() or _info(self.primary)["role"] == "master"):
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"cluster node 127.0.0.1:{self.primary.port} did not rejoin its shard")
            time.sleep(0.01)


def shard(cluster: EmbeddedCluster, key: str) -> tuple[ClusterNode, ClusterNode]:
    """(the primary that serves `key`'s slot, a replica of it), as the cluster sees them now."""
    owner = connect.node_for(cluster.url, key)
    try:
        port = owner.connection_pool.connection_kwargs["port"]
        mine = next(n for n in connect.cluster_nodes(owner) if "myself" in n.flags)
        replicas = [n for n in connect.cluster_nodes(owner) if n.primary == mine.id and "fail" not in n.flags]
    finally:
        owner.close()
    by_port = {node.port: node for node in cluster.nodes}
    if not replicas:
        raise ServerUnavailable(f"the primary 127.0.0.1:{port} of the run's slot has no replica to promote")
    return by_port[port], by_port[int(replicas[0].address.rpartition(":")[2])]


def _info(node: ClusterNode) -> dict[str, str]:
    client = node.client()
    try:
        return client.info("replication")
    finally:
        client.close()


def _call(node: ClusterNode, *args: str | int) -> None:
    client = node.client()
    try:
        client.execute_command(*args)
    finally:
        client.close()


@contextlib.contextmanager
def cluster_broker(cluster: EmbeddedCluster, key: str) -> Iterator[ClusterBroker]:
    home = workdirs.make("broker")
    broker = None
    try:
        broker = ClusterBroker(cluster, key, home / "server.url")
        yield broker
    finally:
        try:
            if broker is not None:
                broker.heal()
        finally:
            shutil.rmtree(home, ignore_errors=True)


class Watcher(threading.Thread):
    """Waits for the replica's promotion and reads it at once, while its client writes still wait,
    then lets them go: on a thread, since the runner's own commands may be among those waiting."""

    def __init__(
        self, broker: ClusterBroker, read: Callable[[redis.Redis], Located] | None, clock: Callable[[], float]
    ) -> None:
        super().__init__(name="crashbench-promotion", daemon=True)
        self.broker, self.read, self.clock = broker, read, clock
        self.at: float | None = None  # harness clock: the replica reported itself primary
        self.held: set[str] | None = None
        self.offset: int | None = None  # the replication offset the promoted replica took over at
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + PROMOTION_TIMEOUT_S
            while not self.broker.promoted():
                if time.monotonic() > deadline:
                    raise ServerUnavailable(f"the replica was not promoted within {PROMOTION_TIMEOUT_S:.0f} s")
                time.sleep(0.002)
            self.at = self.clock()
            if self.read is not None:
                client = redis.Redis(host="127.0.0.1", port=self.broker.replica.port, socket_timeout=10)
                try:
                    self.held = set(self.read(client).held)
                finally:
                    client.close()
            # The offset it took over at: second_repl_offset is one past it.
            self.offset = int(_info(self.broker.replica)["second_repl_offset"]) - 1
        except BaseException as exc:  # re-raised by the runner's loop
            self.error = exc
        finally:
            with contextlib.suppress(redis.RedisError):
                self.broker.unpause()


class ClusterFaults:
    """A cluster fault fired from the runner's loop (crashbench.faults.injector.BrokerFaults' twin):
    the replica cut `replica_lag` s before; at the fault, the primary's reading and the strike; once the
    replica is promoted, its reading (Watcher), the runner's clients moved to it, and, for a kill, the
    old primary restarted `downtime` s later and rejoined."""

    fine = False  # stepped once a tick (crashbench.faults.family.Driver)

    def __init__(
        self,
        planned: list[Fault],
        broker: ClusterBroker,
        producer: Producer,
        replica_lag: float,
        persistence: str,
        locate: Callable[[redis.Redis | None], Located],
        reconnect: Callable[[], None],
        mark: Callable[[float, str], None],
        clock: Callable[[], float],
    ) -> None:
        self.fault = next(f for f in planned if f.kind.startswith("cluster-"))  # crashbench.faults.servers
        self.broker, self.producer = broker, producer
        self.locate, self.reconnect, self.mark, self.clock = locate, reconnect, mark, clock
        self.t0 = 0.0
        self.record: BrokerFaultRecord | None = None
        self.held_at_fault: set[str] = set()
        self.held_after_promotion: set[str] = set()
        self.watcher: Watcher | None = None
        self._cut = ReplicaCut(self.broker.cut_replica, self.producer, replica_lag, self.mark, self.clock)
        self._restart_at: float | None = None
        self._heal_at: float | None = None  # a partition: when the cut heals
        self._rejoining = False

    @property
    def down(self) -> bool:
        """Struck and not back yet: the server (the shard's primary) answers nothing meanwhile."""
        return self.record is not None and self.record.back_at is None

    @property
    def done(self) -> bool:
        return (
            self.producer.done and self.record is not None and self.record.back_at is not None
            and self._restart_at is None and self._heal_at is None and not self._rejoining
        )  # fmt: skip

    def step(self, now: float) -> None:
        kind, due = self.fault.kind, self._cut.step(now, self.t0 + self.fault.at)
        if self.record is None and now >= due:
            offset = self.broker.pause_primary()  # a snapshot, as on one server (BrokerFaults)
            self.held_at_fault = held = set(self.locate(None).held)
            now = self.clock()
            self.record = BrokerFaultRecord(
                kind, "none", rel(now, self.t0), len(held), sorted(held)[:JOB_SAMPLE], self.producer.acknowledged,
                primary_offset=offset,
            )  # fmt: skip
            graceful = kind == "cluster-failover"
            self.watcher = Watcher(self.broker, None if graceful else self.locate, self.clock)
            self.broker.strike(kind)
            # Cut off, the old primary goes on acknowledging what the promoted replica never gets; a
            # killed one (or one handed over gracefully) acknowledges nothing more.
            self.producer.lagging = kind == "cluster-partition"
            self.watcher.start()
            self.mark(now, {"cluster-kill": "down", "cluster-partition": "partition"}.get(kind, "failover"))
        if self.watcher is not None and not self.watcher.is_alive():
            self._promoted(self.watcher)
        if self._restart_at is not None and now >= self._restart_at:
            self.broker.restart_old()
            self._restart_at, self._rejoining = None, True
        if self._heal_at is not None and now >= self._heal_at:
            self._heal()
        if self._rejoining and self.broker.rejoined():
            self._rejoining = False
            self.broker.resume_primary()  # a cut-off primary's clients, now told MOVED
            assert self.record is not None
            self.record.rejoined_at = rel(self.clock(), self.t0)
            self.mark(self.clock(), "rejoined")

    def _promoted(self, watcher: Watcher) -> None:
        self.watcher = None
        if watcher.error is not None:
            raise watcher.error
        assert self.record is not None and watcher.at is not None
        self.record.back_at = rel(watcher.at, self.t0)
        self.record.promoted_offset = watcher.offset
        if watcher.held is not None:
            self.held_after_promotion = watcher.held
            self.record.promoted_held = len(watcher.held)
        self.mark(watcher.at, "up")
        self.reconnect()  # the runner's client and inspector, on the promoted replica
        self.producer.lagging = False  # its enqueues go to the promoted replica from now on
        if self.fault.kind == "cluster-kill":
            self._restart_at = watcher.at + self.fault.duration
        elif self.fault.kind == "cluster-partition":
            self._heal_at = watcher.at + self.fault.duration
        else:
            self._rejoining = True  # the old primary, now its replica

    def _heal(self) -> None:
        """The old primary's last word read (what it took while cut off is in it, and about to be thrown
        away: the reading that not_replicated compares with the promoted replica's), then the cut healed."""
        assert self.record is not None
        self._heal_at = None
        self.held_at_fault = held = self.broker.last_word(self.locate)
        self.record.held_at_fault, self.record.held_ids = len(held), sorted(held)[:JOB_SAMPLE]
        self.broker.mend()
        self.mark(self.clock(), "healed")
        self._rejoining = True
