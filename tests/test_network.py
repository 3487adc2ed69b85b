"""Network faults in real runs: half-open connections with and without socket timeouts, the producer
and a failover's replica link cut off, real partitions (where the machine can), and the refusals of
what cannot be made. The proxy's toxics byte by byte are in test_proxy.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from crashbench import faults
from crashbench.control.proxyctl import ProxyProcess, proxy_for
from crashbench.errors import UsageError
from crashbench.faults import netns
from crashbench.model.queue import Job
from crashbench.model.spec import Scenario
from crashbench.report import html
from crashbench.run.producer import Through
from crashbench.run.session import Options, run_designs, run_sweep
from crashbench.scenario import problems_of
from tests.conftest import assert_recounts

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow


@pytest.fixture
def proxy(valkey_url: str, tmp_path: Path) -> ProxyProcess:
    px = proxy_for(valkey_url, 2, tmp_path / "proxy.log")
    yield px
    px.close()


def test_a_toxic_the_proxy_does_not_know_is_refused(proxy: ProxyProcess) -> None:
    with pytest.raises(Exception, match="refused"):
        proxy.set([0], [{"name": "gremlins"}])


def test_a_half_open_connection_is_a_reconnect_with_timeouts_and_a_stuck_worker_without(
    valkey_url: str, small: Scenario, tmp_path: Path
) -> None:
    """Every worker's connection goes silent for 0.7 s under its blocking pop. With a 1 s socket timeout
    each reconnects and the queue drains; with none (redis-py before 6 ships it so) each waits for an
    answer that never comes: stuck, while the harness still reads jobs waiting."""
    half_open = {"kind": "network", "toxic": "timeout", "at": 0.3, "duration": 0.7}
    sc = small.replace(jobs=200, job_ms=5, workers=2, kills=0, schedule=(half_open,), drain_timeout=2)
    result = run_sweep(sc, "reliable", "socket_timeout", "1,0", Options(redis_url=valkey_url))
    with_timeouts, without = result.runs
    assert with_timeouts.problems == [] and without.problems == []
    (nf,) = with_timeouts.network_faults
    assert nf.slots == [0, 1] and nf.healed_at is not None and nf.resume_ms is not None and nf.stuck == []
    assert with_timeouts.counts.stuck_workers == 0 and with_timeouts.counts.lost == 0
    assert with_timeouts.counts.done == 200 and with_timeouts.timings.drained
    (nf,) = without.network_faults
    assert nf.stuck == [0, 1] and nf.resume_ms is None
    assert without.counts.stuck_workers == 2 and not without.timings.drained
    assert without.counts.stranded + without.counts.undrained > 0 and without.counts.lost == 0
    assert_recounts(result, tmp_path)  # liveness, from the timeline alone


def test_network_faults_need_a_tcp_server_url(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="need a TCP server URL"):
        proxy_for("unix:///tmp/redis.sock", 2, tmp_path / "proxy.log")


@pytest.mark.parametrize("direction, landed", [("downstream", 10), ("upstream", 0)])
def test_a_producer_cut_off_makes_indeterminate_enqueues_and_only_a_request_that_arrived_runs(
    valkey_url: str, small: Scenario, direction: str, landed: int
) -> None:
    """The producer's connection goes silent one way for 0.5 s with 0.3 s timeouts: the enqueues that
    meet it (two, or one when a loaded machine paces the producer slower) are each recorded
    indeterminate and never retried. Replies lost: the first one's request had reached
    the server, and its jobs run; the second's never left (the reconnect's handshake got no answer).
    Requests lost: neither ran. Either way no acknowledged enqueue is missing and nothing runs twice."""
    cut = {"kind": "network", "target": "producer", "toxic": "timeout", "direction": direction, "at": 0.2,
           "duration": 0.5}  # fmt: skip
    sc = small.replace(jobs=200, job_ms=2, workers=2, kills=0, schedule=(cut,), produce_s=0.8, socket_timeout=0.3)
    result = run_designs(sc, ["reliable"], Options(redis_url=valkey_url))
    run = result.runs[0]
    c, (nf,) = run.counts, run.network_faults
    assert run.problems == [] and nf.target == "producer" and nf.slots == [] and nf.resume_ms is not None
    # A reply can only be lost on a connection that was open: were the producer's first enqueue after
    # the cut (its start late under load), its connection's handshake meets the cut and no request of
    # the two ever leaves. The timeline's own enqueues say which it was.
    assert run.timeline is not None
    if not any(e.ok and e.t < nf.at for e in run.timeline.enqueues):
        landed = 0
    assert c.indeterminate in (10, 20) and c.recovered == landed
    assert c.lost == c.duplicated == c.stranded == 0 and c.done == 200 - c.indeterminate + landed
    # The report draws it off the lanes, for its span, and counts it among the faults.
    page = html.render(result, [run.timeline])  # type: ignore[list-item]
    assert page.count('class="band network elsewhere timeout"') == 1 and "network timeout on the producer" in page
    assert "· 1 fault</p>" in page


def test_a_replica_link_gone_silent_before_a_failover_loses_what_the_primary_acknowledged_since(
    small: Scenario, tmp_path: Path
) -> None:
    """The replica follows its primary through the proxy; its link goes silent 0.7 s before the primary
    dies and the replica is promoted. Lost: exactly what the primary acknowledged after the link went
    silent and no worker ran before the failover (the harness's WAIT made the cut exact). 300 jobs over
    2 s, more than twice as fast as 2 workers run 30 ms jobs: a backlog builds however late a loaded
    machine runs the loop, so jobs of the lag still wait at the failover."""
    link = {"kind": "network", "target": "replica", "toxic": "timeout", "at": 0.5}
    sc = small.replace(
        jobs=300, job_ms=30, workers=2, kills=0, fault="failover", fault_at=1.2, produce_s=2.0,
        schedule=(link,),
    )  # fmt: skip
    result = run_designs(sc, ["reliable"], Options())
    run = result.runs[0]
    c, (nf,), bf = run.counts, run.network_faults, run.broker_fault
    assert run.problems == [] and bf is not None and bf.kind == "failover" and nf.target == "replica"
    assert c.lost == c.acked_during_lag > 0 and c.indeterminate == 0 and c.stranded == 0
    assert_recounts(result, tmp_path)


@pytest.mark.parametrize(
    "entry, broker, problem",
    [
        ({"target": "replica"}, "none", 'target = "replica" needs a failover run'),
        ({"target": "producer"}, "broker-kill", 'target = "producer" cannot be combined with a broker fault'),
        ({}, "failover", 'target = "workers" cannot be combined with a broker fault'),
        ({"target": "producer", "slot": 0}, "none", 'slot and workers are for target = "workers"'),
        ({"target": "server"}, "none", "target must be one of workers, producer, replica, not 'server'"),
        ({"toxic": "loss"}, "none", "loss needs a probability, more than 0 and at most 1, not None"),
        ({"toxic": "loss", "probability": 1.5}, "none", "loss needs a probability, more than 0 and at most 1"),
        ({"toxic": "drop", "probability": 0.5}, "none", "probability is for loss, not drop"),
        ({"toxic": "drop", "direction": "upstream"}, "none", "drop is on the slot's packets both ways"),
        ({"toxic": "reject", "target": "producer"}, "none", "reject is for workers"),
        ({"toxic": "drop", "latency": 100}, "none", "latency are attributes of the proxy's toxics, not of drop"),
        ({"toxic": "latency", "probability": 0.5}, "none", "probability is for loss"),
    ],
)
def test_a_network_fault_the_proxy_cannot_make_is_refused(
    small: Scenario, entry: dict[str, object], broker: str, problem: str
) -> None:
    fault = {"kind": "network", "toxic": "timeout", "at": 0.5, **entry}
    sc = small.replace(schedule=(fault,), fault=broker)
    assert any(problem in p for p in problems_of(sc)), problems_of(sc)


def test_an_enqueue_through_the_proxy_that_never_returns_is_abandoned_with_its_design() -> None:
    """A library client without a socket timeout would hang the harness on a silent connection: the
    enqueue is waited for at most its bound, then recorded indeterminate, and the next one gets a
    fresh design (its client), as Jepsen abandons a client whose operation timed out."""
    release, made = threading.Event(), []

    class Stub:  # stands for a design: the first one's client hangs, the others answer or raise
        def __init__(self) -> None:
            self.n, self.r = len(made), redis.Redis()
            made.append(self)

        def enqueue(self, chunk: list[Job]) -> None:
            if self.n == 0:
                release.wait()
            if chunk[0].id == "bad":
                raise OSError("whatever a library raises")

    through = Through(Stub, bound=0.2)  # type: ignore[arg-type]
    started = time.monotonic()
    assert through.enqueue([Job("1", "{}")]) is False and through.abandoned == 1 and len(made) == 2
    assert time.monotonic() - started < 2
    assert through.enqueue([Job("2", "{}")]) is True and through.enqueue([Job("bad", "{}")]) is False
    assert len(made) == 2 and through.abandoned == 1
    release.set()
    through.close()


def test_a_run_uses_the_proxy_or_partitions_not_both(small: Scenario) -> None:
    drop = {"kind": "network", "toxic": "drop", "at": 0.5, "duration": 0.5}
    slow = {"kind": "network", "toxic": "latency", "latency": 100, "at": 0.5}
    problems = problems_of(small.replace(schedule=(drop, slow)))
    assert any("the proxy's toxics or network partitions" in p for p in problems), problems
    assert netns.RULES == faults.PARTITION_TOXICS  # one vocabulary, checked where it is parsed


def test_partitions_refuse_a_server_crashbench_did_not_start(small: Scenario, valkey_url: str) -> None:
    """They change the server's bind and protected mode: never on a server crashbench does not own."""
    drop = {"kind": "network", "toxic": "drop", "at": 0.2, "duration": 0.2}
    sc = small.replace(jobs=50, kills=0, schedule=(drop,))
    with pytest.raises(UsageError, match="need a server crashbench starts"):
        run_designs(sc, ["reliable"], Options(redis_url=valkey_url))


@pytest.mark.skipif(netns.unavailable() is not None, reason=f"network partitions: {netns.unavailable()}")
def test_a_real_partition_is_a_reconnect_with_timeouts_and_leaves_nothing_behind(small: Scenario) -> None:
    """Both workers in their own namespace, every packet of theirs dropped for 0.6 s under their blocking
    pop, 0.5 s socket timeouts: each times out, reconnects once healed, and the queue drains; nothing is
    lost, nothing runs twice at once, and no namespace or iptables chain of the run is left."""
    drop = {"kind": "network", "toxic": "drop", "at": 0.3, "duration": 0.6}
    sc = small.replace(jobs=200, job_ms=5, workers=2, kills=0, schedule=(drop,), socket_timeout=0.5)
    run = run_designs(sc, ["reliable"], Options()).runs[0]
    c, (nf,) = run.counts, run.network_faults
    assert run.problems == [] and nf.toxic == "drop" and nf.slots == [0, 1] and nf.resume_ms is not None
    assert c.lost == c.stranded == c.stuck_workers == c.duplicated_overlapping == 0 and c.done == 200
    # Given back by the reaper: a job whose ack died in the partition (run again: a duplicate), or one
    # whose pop's reply died there (never run before: it runs once). Every duplicate is one of them.
    assert c.duplicated <= c.requeued
    mine = f"cb-{os.getpid()}"
    assert mine not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert mine not in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout


def test_the_readme_network_table_is_what_its_result_files_give() -> None:
    """The network table of docs/findings/network.md is regenerated from results/readme/network (make network)."""
    root = Path(__file__).resolve().parent.parent
    table = subprocess.run(
        [sys.executable, str(root / "lab" / "network_table.py"), str(root / "results" / "readme" / "network")],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    readme = (root / "docs" / "findings" / "network.md").read_text()
    rows = [row for row in table[2:] if not row.startswith("| net-replica-partition")]
    assert len(rows) == 42 and all(row in readme for row in rows)
    assert table[0] in readme
