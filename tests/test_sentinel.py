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


def _asked(topo: object) -> int:
    """Connections the topology's sentinels have received (a sentinel keeps no commandstats): a Sentinel
    client opens one to ask for the primary; the harness reads the primary directly. This reading's own
    connections included."""
    total = 0
    for sentinel in topo.sentinels:  # type: ignore[attr-defined]
        client = redis.Redis.from_url(sentinel.url, decode_responses=True)
        try:
            total += int(client.info("stats")["total_connections_received"])
        finally:
            client.close()
    return total


def test_with_sentinel_a_session_runs_on_a_private_topology_whose_workers_ask_the_sentinels(
    small: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--sentinel (broker.topology = "sentinel"): the session's server is a topology's primary, the
    workers are told only the sentinels (they ask them: the sentinels count it), nothing outlives it."""
    from crashbench.control.sentinel import SentinelTopology
    from crashbench.run.session import Options, run_designs

    asked: list[int] = []
    pids: list[int] = []
    real_start, real_stop = SentinelTopology.start, SentinelTopology.stop

    def start(self: SentinelTopology) -> None:  # the real start, then what the sentinels were asked until then
        real_start(self)
        asked.append(-_asked(self))

    def stop(self: SentinelTopology) -> None:  # the real stop, after reading what the sentinels were asked
        asked[0] += _asked(self) - len(self.sentinels)  # less this reading's own
        pids.extend(p.proc.pid for p in self.processes if p.proc is not None)
        real_stop(self)

    monkeypatch.setattr(SentinelTopology, "start", start)
    monkeypatch.setattr(SentinelTopology, "stop", stop)
    result = run_designs(small.replace(topology="sentinel", jobs=200, kills=2), ["reliable"], Options())
    run = result.runs[0]
    assert result.environment.server_mode == "sentinel" and "redis+sentinel://" in result.environment.server_url
    assert run.problems == [] and run.counts.done == 200 and run.counts.lost == 0
    assert asked and asked[0] >= small.workload.workers + 2  # every worker, the two restarted after kills too
    assert len(pids) == 6 and not [pid for pid in pids if _alive(pid)]


def test_an_external_sentinel_by_url_is_followed_and_left_running_untouched_outside_the_namespace(
    small: Scenario,
) -> None:
    """--redis-url redis+sentinel://...: the harness reads the primary the sentinels name, the workers ask
    the sentinels; a key of someone else's is still there after, and every process of theirs still runs."""
    from crashbench.run.session import Options, run_designs

    with sentinel_topology() as topo:
        mine = redis.Redis.from_url(topo.primary.url)
        mine.set("not-crashbench", "kept")
        before = _asked(topo)
        result = run_designs(small.replace(jobs=200, kills=2), ["reliable"], Options(redis_url=topo.url))
        run = result.runs[0]
        assert result.environment.server_mode == "external-sentinel"
        assert run.problems == [] and run.counts.done == 200 and run.counts.lost == 0
        assert _asked(topo) - before - len(topo.sentinels) >= small.workload.workers
        assert mine.get("not-crashbench") == b"kept" and mine.keys("crashbench:*") == []
        mine.close()
        assert all(_alive(p.proc.pid) for p in topo.processes if p.proc is not None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis-url", "redis+sentinel://:pw@127.0.0.1:1/m", "--broker-fault", "broker-kill"], "not on a Sentinel"),
        (["--redis-url", "redis+sentinel://:pw@127.0.0.1:1/m", "--broker-fault", "sentinel-kill"], "only to a server"),
        (["--sentinel", "--broker-fault", "failover"], "not on a Sentinel topology"),
        (["--sentinel", "--cluster", "3"], "give one of them"),
        (["--sentinel", "--topology", "single"], "give one of them"),
        (["--sentinel", "--network", "toxic=down,at=1,duration=1"], "not behind Sentinel"),
        (["--broker-fault", "sentinel-kill", "--network", "toxic=down,at=1,duration=1"], "cannot be combined"),
        (["--sentinel", "--persistence", "aof-always"], "run without it"),
        (["--sentinel", "--redis-url", "redis://127.0.0.1:1"], "give one of them"),
    ],
)
def test_what_a_sentinel_topology_cannot_do_is_refused_in_one_line(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from crashbench.cli import cli
    from crashbench.errors import ExitCode

    got = CliRunner().invoke(cli, ["run", *args, "--plain"])
    assert got.exit_code == ExitCode.USAGE and message in got.output, got.output
    assert "Traceback" not in got.output and ":pw@" not in got.output


def test_sentinels_that_do_not_answer_are_one_line_without_the_password() -> None:
    from click.testing import CliRunner

    from crashbench.cli import cli
    from crashbench.errors import ExitCode

    got = CliRunner().invoke(
        cli, ["run", "--plain"], env={"CRASHBENCH_REDIS_URL": "redis+sentinel://:s3cret@127.0.0.1:1/m"}
    )
    assert got.exit_code == ExitCode.SERVER_UNAVAILABLE and "names a primary" in got.output, got.output
    assert "Traceback" not in got.output and "s3cret" not in got.output


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


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
    def watched(*args: object, **kwargs: object):
        with real(*args, **kwargs) as broker:  # type: ignore[arg-type]
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


def test_with_the_quorum_lost_nothing_is_promoted_until_the_killed_sentinels_are_back(
    small: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sentinel-quorum: two of three sentinels and then the primary SIGKILLed; the one left cannot fail over
    (the sentinels' own answer: it names the dead primary until the others return); restarted from their
    config files, they promote a replica; the workers resume on it; every process, restarted ones too, gone."""
    import contextlib

    from crashbench.run import session
    from crashbench.run.session import Options, run_designs

    topologies = []
    real = session.sentinel_broker

    @contextlib.contextmanager
    def watched(*args: object, **kwargs: object):
        with real(*args, **kwargs) as broker:  # type: ignore[arg-type]
            topologies.append(broker.topology)
            yield broker

    monkeypatch.setattr(session, "sentinel_broker", watched)
    # The producer goes on past the promotion (about 0.8 + 1.5 + 2.2 s), so that there are jobs to resume on
    # even when none of those held at the kill had reached the replicas (a loaded machine's replication lag).
    sc = small.replace(jobs=400, job_ms=10, kills=0, fault="sentinel-quorum", fault_at=0.8, downtime=1.5, produce_s=6.0)
    run = run_designs(sc, ["reliable"], Options()).runs[0]
    bf, c = run.broker_fault, run.counts
    assert run.problems == [] and bf is not None and bf.quorum_back_at is not None and bf.back_at is not None
    assert bf.quorum_back_at - bf.at >= 1.5 and bf.back_at - bf.quorum_back_at >= 1.0  # their down-after first
    assert c.promoted_without_quorum == 0 and c.stuck_workers == 0 and c.lost == c.held_at_fault
    # Every worker ran a job after the promotion, where there was one to run: a loaded machine's promotion can
    # come after the producer's last enqueue, with nothing the killed primary held on the replicas.
    after = [e for e in run.timeline.enqueues if e.ok and e.t > bf.back_at]
    assert len(bf.slot_resume_ms) == 4 and (not after or all(ms is not None for ms in bf.slot_resume_ms))
    (topo,) = topologies
    pids = [p.proc.pid for p in topo.processes if p.proc is not None]
    assert len(pids) == 6 and not [pid for pid in pids if _alive(pid)]


def test_a_failover_under_running_handlers_re_runs_the_jobs_whose_acks_met_the_dead_primary() -> None:
    """sentinel-midjob: the primary killed while every worker runs a 400 ms job: the ledger shows the 4
    handlers running at the kill; the reliable design's acks meet the dead primary, so each job, still in
    its processing list on the promoted replica, runs again; nothing is lost, nobody is stuck. (naive's
    none-ran-again is in the committed results: tests/test_sentinel_findings.py)"""
    from crashbench.run.session import Options, run_designs
    from crashbench.scenario import load

    # killed 1 s into the first round of 2 s jobs (with 400 ms jobs and the kill at 0.6 s, a loaded clean
    # clone's workers were between handlers at the kill); a reaper that takes no running job for dead
    sc = load("sentinel-midjob").replace(
        jobs=16, job_ms=2000, fault_at=1.0, produce_s=0.2, stale_after=3.0, recover_every=0.05
    )
    (run,) = run_designs(sc, ["reliable"], Options()).runs
    c = run.counts
    assert c.mid_job_at_fault == 4 and c.mid_job_ran_again == 4 == c.duplicated
    assert c.lost == 0 and c.stuck_workers == 0 and run.problems == []
