"""The embedded Sentinel topology (crashbench.control.sentinel): real servers and real sentinels that
decide a failover on their own once the primary is SIGKILLed; every process gone afterwards."""

from __future__ import annotations

import time

import psutil
import pytest
import redis

from crashbench.control.sentinel import MASTER_NAME, sentinel_topology

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow


def test_the_sentinels_promote_a_replica_when_the_primary_is_killed_and_nothing_outlives_the_topology() -> None:
    with sentinel_topology() as topo:
        pids = [p.proc.pid for p in topo.processes if p.proc is not None]
        assert len(pids) == 6 and all(psutil.pid_exists(pid) for pid in pids)
        assert topo.primary_address() == ("127.0.0.1", topo.primary.port)
        # A write on the primary reaches the replicas (the topology replicates before any fault).
        client = redis.Redis.from_url(topo.primary.url)
        client.set("k", "v")
        client.execute_command("WAIT", 2, 5000)
        client.close()

        replica_ports = {r.port for r in topo.replicas}
        topo.primary.kill()
        # The sentinels' own decision: +sdown after 1 s, +odown with the quorum, a replica promoted.
        deadline = time.monotonic() + 30
        while topo.primary_address()[1] not in replica_ports:
            assert time.monotonic() < deadline, "no failover within 30 s"
            time.sleep(0.1)
        promoted = redis.Redis(port=topo.primary_address()[1])
        try:
            assert promoted.info("replication")["role"] == "master" and promoted.get("k") == b"v"
        finally:
            promoted.close()
        # The others learn it from the one that failed over (its hello messages, every 2 s): all name it.
        while len(named := {_named(s.url) for s in topo.sentinels}) > 1 or not named <= replica_ports:
            assert time.monotonic() < deadline, f"the sentinels still name {named}"
            time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def _named(url: str) -> int:
    sentinel = redis.Redis.from_url(url, decode_responses=True)
    try:
        return int(sentinel.sentinel_master(MASTER_NAME)["port"])
    finally:
        sentinel.close()
