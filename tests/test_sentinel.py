"""The embedded Sentinel topology (crashbench.control.sentinel): real servers and real sentinels that
decide a failover on their own once the primary is SIGKILLed; every process gone afterwards."""

from __future__ import annotations

import time

import psutil
import pytest
import redis

from crashbench.control.sentinel import MASTER_NAME, sentinel_topology
from crashbench.model.spec import Scenario

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


def test_a_client_of_a_sentinel_url_follows_the_primary_the_sentinels_promote() -> None:
    """connect.connect on `redis+sentinel://...`: redis-py's Sentinel client, which asks the sentinels for
    the primary again after a connection error; the same client object writes to the promoted replica."""
    from crashbench.control import connect

    with sentinel_topology() as topo:
        hosts = ",".join(f"{h}:{p}" for h, p in topo.sentinel_addresses)
        client = connect.connect(f"redis+sentinel://{hosts}/{MASTER_NAME}/0", socket_timeout=2)
        try:
            client.set("before", 1)
            assert client.info("server")["tcp_port"] == topo.primary.port
            topo.primary.kill()
            deadline = time.monotonic() + 30
            while True:  # the sentinels' own decision, then the client's next connection finds the new one
                try:
                    client.set("after", 1)
                    break
                except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                    assert time.monotonic() < deadline, "the client found no new primary within 30 s"
                    time.sleep(0.1)
            assert client.info("server")["tcp_port"] in {r.port for r in topo.replicas}
            assert client.get("before") == b"1"  # replicated before the kill
        finally:
            client.close()


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("redis+sentinel://127.0.0.1:26379/mymaster", ((("127.0.0.1", 26379),), "mymaster", 0, None)),
        ("redis+sentinel://:s3cret@a:1,b:2/m/3", ((("a", 1), ("b", 2)), "m", 3, "s3cret")),
    ],
)
def test_a_sentinel_url_is_read_into_its_sentinels_master_database_and_password(url: str, parts: tuple) -> None:
    from crashbench.control.connect import parse_sentinel

    p = parse_sentinel(url)
    assert (p.sentinels, p.master, p.db, p.password) == parts


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://host/m", "host:port"),
        ("redis+sentinel://:pw@h:1", "no master name"),
        ("redis+sentinel://h:1/m/x", "must be a number"),
    ],
)
def test_a_sentinel_url_that_cannot_be_read_says_what_is_wrong_without_its_password(url: str, message: str) -> None:
    from crashbench.control.connect import parse_sentinel

    with pytest.raises(ValueError, match=message) as err:
        parse_sentinel(url)
    assert "pw" not in str(err.value)


def test_a_run_on_a_sentinel_url_is_refused_in_one_line_for_now() -> None:
    from click.testing import CliRunner

    from crashbench.cli import cli
    from crashbench.errors import ExitCode

    got = CliRunner().invoke(cli, ["run", "--redis-url", "redis+sentinel://:pw@127.0.0.1:1/m", "--plain"])
    assert got.exit_code == ExitCode.USAGE and "not supported yet" in got.output
    assert "Traceback" not in got.output and "pw" not in got.output


def test_under_sentinel_kill_the_workers_find_the_promoted_primary_through_the_sentinels(
    small: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[broker] fault = "sentinel-kill": a private topology, its primary SIGKILLed; the sentinels promote a
    replica (after their 1 s down-after at least), the built-in workers, told only the sentinels' addresses,
    run jobs on it, and what is lost is only what the dead primary alone held. Every process is gone after."""
    import contextlib

    from crashbench.run import session
    from crashbench.run.session import Options, run_designs

    pids: list[int] = []  # the run's own topology's processes, as session.sentinel_broker (the real one) made them
    real = session.sentinel_broker

    @contextlib.contextmanager
    def watched(*args: object):
        with real(*args) as broker:  # type: ignore[arg-type]
            pids.extend(p.proc.pid for p in broker.topology.processes if p.proc is not None)
            yield broker

    monkeypatch.setattr(session, "sentinel_broker", watched)
    sc = small.replace(jobs=400, job_ms=10, kills=0, fault="sentinel-kill", fault_at=0.8, produce_s=1.0)
    run = run_designs(sc, ["reliable"], Options()).runs[0]
    bf, tl, c = run.broker_fault, run.timeline, run.counts
    assert run.problems == [] and bf is not None and bf.kind == "sentinel-kill" and bf.back_at is not None
    assert 1.0 <= bf.back_at - bf.at < 30  # the sentinels' own decision: down for DOWN_AFTER_MS first
    assert tl is not None and any(ex.start > bf.back_at and ex.completed for ex in tl.executions)
    assert c.lost == c.held_at_fault and c.stranded == 0 and c.unexpected == 0
    assert len(pids) == 6  # three servers, three sentinels: all gone (a zombie at most, until reaped)
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_the_sentinel_findings_table_is_the_committed_result_s() -> None:
    """docs/findings/sentinel.md's table is what lab/sentinel_promotion.py makes of results/readme/sentinel,
    and its promotion times are the records' own (a sentinel's decision takes its 1 s down-after at least)."""
    import runpy
    from pathlib import Path

    from crashbench.report import store

    root = Path(__file__).resolve().parent.parent
    lab = runpy.run_path(str(root / "lab" / "sentinel_promotion.py"))
    out = root / "results" / "readme" / "sentinel"
    doc = (root / "docs" / "findings" / "sentinel.md").read_text()
    assert "\n".join(line for line in doc.splitlines() if line.startswith("|")) == lab["table"](out)
    runs = [run for path in sorted(out.glob("*.json")) for run in store.load(str(path)).runs]
    assert len(runs) == 9 and all(1.0 <= lab["promotion_s"](run) < 30 for run in runs)
