"""reliable-batch, stream-batch and priority: their mechanics on a real server with the clock passed in,
and crash runs with real workers and real SIGKILLs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

from crashbench.control.lease import namespace
from crashbench.control.server import cleanup_keys
from crashbench.designs.priority import Priority, PriorityQueue, priority_of
from crashbench.designs.reliable_batch import ReliableBatchQueue
from crashbench.designs.stream_batch import StreamBatchQueue
from crashbench.model.ledger import Execution, Ledger
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs

SETTINGS = DesignSettings(stale_after=10.0, recover_every=1.0, max_attempts=3, batch_size=10)
HIGH_FROM = 500  # LastJobsHigh marks the jobs from this index on (the last 100 of `small`'s 600) high


class LastJobsHigh(PriorityQueue):
    """The runner marks no job high; this producer marks the last ones, through the payload."""

    def enqueue(self, jobs: Sequence[Job], priority: Priority | None = None) -> None:
        high = lambda j: json.loads(j.payload)["n"] >= HIGH_FROM  # noqa: E731 - the id is opaque: the payload's number
        marked = [Job(j.id, json.dumps({**json.loads(j.payload), "priority": "high"})) if high(j) else j for j in jobs]
        super().enqueue(marked, priority)


class CountingConnection(redis.Connection):
    """Counts round trips: a pipeline or a script call is one send, whatever it holds."""

    sends: ClassVar[int] = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counting(valkey_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(valkey_url, decode_responses=True, connection_class=CountingConnection)
    yield c
    c.close()


def round_trips(call: Callable[[], Any]) -> tuple[int, Any]:
    before = CountingConnection.sends
    result = call()
    return CountingConnection.sends - before, result


def ids(jobs: Sequence[Job]) -> list[str]:
    return [j.id for j in jobs]


def numbered(prefix: str, n: int) -> list[Job]:
    return [Job(f"{prefix}{i:02d}", json.dumps({"n": i})) for i in range(n)]


def assert_evidence_agrees(run: DesignRun) -> None:
    """No evidence check fired: the design's report, the ledgers and Redis as read by the harness agree."""
    assert run.problems == [], [str(p) for p in run.problems]


# -- reliable-batch ----------------------------------------------------------------------------------


def test_reliable_batch_moves_a_batch_per_round_trip_and_acks_it_in_one(counting: redis.Redis) -> None:
    q = ReliableBatchQueue(counting, "test:rbatch1:", SETTINGS)
    jobs = numbered("r", 25)
    q.enqueue(jobs)
    q.start_worker("w1", now=0.0)
    first = q.fetch_batch("w1", 0.01, now=0.0)  # loads the script: not counted
    assert ids(first) == ids(jobs[:10]) and all(j.attempt == 1 for j in first)
    held = q.state().held
    assert [held[j.id] for j in jobs] == ["processing:w1"] * 10 + ["pending"] * 15
    q.ack_batch("w1", [], now=0.05)  # loads the ack script: not counted
    trips, _ = round_trips(lambda: q.ack_batch("w1", first, now=0.1))
    assert trips == 1
    assert q.backlog() == 15

    trips, second = round_trips(lambda: q.fetch_batch("w1", 0.01, now=0.2))
    assert trips == 1 and ids(second) == ids(jobs[10:20])
    q.ack_batch("w1", second[:9], now=0.3)  # a partial ack forgets exactly those
    assert q.state().held == {j.id: "pending" for j in jobs[20:]} | {jobs[19].id: "processing:w1"}
    q.ack_batch("w1", second[9:], now=0.3)

    trips, third = round_trips(lambda: q.fetch_batch("w1", 0.01, now=0.4))
    assert trips == 1 and ids(third) == ids(jobs[20:])  # the rest, fewer than batch_size
    q.ack_batch("w1", third, now=0.5)
    # Empty: the script finds nothing, then one blocking move (pipelined with the heartbeat) waits.
    trips, none = round_trips(lambda: q.fetch_batch("w1", 0.01, now=0.6))
    assert (trips, none) == (2, [])
    assert q.backlog() == 0 and q.state().held == {}


def test_reliable_batch_falls_back_to_one_blocking_move_when_pending_is_empty(client: redis.Redis) -> None:
    q = ReliableBatchQueue(client, "test:rbatch2:", SETTINGS)
    q.start_worker("w1", now=0.0)
    started = time.monotonic()
    assert q.fetch_batch("w1", 0.2, now=0.0) == []
    assert time.monotonic() - started >= 0.15  # it waited on the server, not spun


def test_reliable_batch_reaper_gives_back_the_whole_batch(client: redis.Redis) -> None:
    q = ReliableBatchQueue(client, "test:rbatch3:", SETTINGS)
    jobs = numbered("k", 12)
    q.enqueue(jobs)
    q.start_worker("w1", now=100.0)
    batch = q.fetch_batch("w1", 0.01, now=100.0)  # then w1 "dies" mid-batch, nothing acked
    assert len(batch) == 10
    q.recover(now=105.0)
    assert sum(where == "processing:w1" for where in q.state().held.values()) == 10
    q.recover(now=111.0)
    state = q.state()
    assert state.held == {j.id: "pending" for j in jobs}
    assert state.requeued == set(ids(batch)) and state.requeue_events == 10
    q.start_worker("w2", now=112.0)
    again = q.fetch_batch("w2", 0.01, now=112.0)
    assert set(ids(again)) == set(ids(batch))  # given back to the head of pending: they go first
    assert all(j.attempt == 2 for j in again)


# -- stream-batch ------------------------------------------------------------------------------------


def test_stream_batch_reads_a_batch_per_round_trip_and_acks_it_with_one_xack(counting: redis.Redis) -> None:
    settings = dataclasses.replace(SETTINGS, recover_every=100.0)  # one claim pass, at the first fetch
    q = StreamBatchQueue(counting, "test:sbatch1:", settings)
    q.setup()
    jobs = numbered("s", 25)
    q.enqueue(jobs)
    first = q.fetch_batch("c1", 0.01, now=0.0)  # the claim pass, then the read
    assert ids(first) == ids(jobs[:10])
    assert {q.state().held[j.id] for j in first} == {"pel:c1"}
    trips, _ = round_trips(lambda: q.ack_batch("c1", first, now=0.1))
    assert trips == 1
    assert q.backlog() == 15

    trips, second = round_trips(lambda: q.fetch_batch("c1", 0.01, now=1.0))
    assert trips == 1 and ids(second) == ids(jobs[10:20])
    q.ack_batch("c1", second, now=1.1)
    third = q.fetch_batch("c1", 0.01, now=2.0)
    assert ids(third) == ids(jobs[20:])
    q.ack_batch("c1", third, now=2.1)
    assert q.fetch_batch("c1", 0.01, now=3.0) == []
    assert q.backlog() == 0 and q.state().held == {}


def test_stream_batch_claims_a_dead_consumers_whole_batch(client: redis.Redis) -> None:
    # min-idle is measured by the server's clock, so this test waits a few milliseconds for it.
    settings = DesignSettings(stale_after=0.002, recover_every=0.0, max_attempts=3, batch_size=10)
    q = StreamBatchQueue(client, "test:sbatch2:", settings)
    q.setup()
    jobs = numbered("c", 12)
    q.enqueue(jobs)
    batch = q.fetch_batch("c1", 0.01, now=0.0)  # then c1 "dies", nothing acked
    assert ids(batch) == ids(jobs[:10])
    time.sleep(0.01)
    claimed = q.fetch_batch("c2", 0.01, now=1.0)
    assert ids(claimed) == ids(batch) and all(j.attempt == 2 for j in claimed)
    state = q.state()
    assert state.held == {j.id: "pel:c2" for j in batch} | {j.id: "pending" for j in jobs[10:]}
    assert state.requeued == set(ids(batch)) and state.requeue_events == 10
    q.ack_batch("c2", claimed, now=1.1)
    rest = q.fetch_batch("c2", 0.01, now=2.0)  # nothing idle to claim: the two never delivered
    assert ids(rest) == ids(jobs[10:])
    q.ack_batch("c2", rest, now=2.1)
    assert q.backlog() == 0


def test_stream_batch_heartbeat_keeps_the_whole_batch_from_being_claimed(client: redis.Redis) -> None:
    settings = DesignSettings(stale_after=0.05, recover_every=0.0, max_attempts=3, batch_size=3)
    q = StreamBatchQueue(client, "test:sbatch3:", settings)
    q.setup()
    jobs = numbered("h", 3)
    q.enqueue(jobs)
    batch = q.fetch_batch("c1", 0.01, now=0.0)
    assert ids(batch) == ids(jobs)
    time.sleep(0.06)
    q.heartbeat("c1", batch[0], now=1.0)  # inside the first job: the two still waiting are refreshed too
    assert q.fetch_batch("c2", 0.01, now=1.0) == []
    assert q.state().held == {j.id: "pel:c1" for j in jobs}
    time.sleep(0.06)
    assert ids(q.fetch_batch("c2", 0.01, now=2.0)) == ids(jobs)  # silent for stale_after: taken over


# -- priority ----------------------------------------------------------------------------------------


def test_priority_of_reads_only_a_json_object_asking_for_high() -> None:
    assert priority_of('{"n": 1, "priority": "high"}') == "high"
    for payload in ('{"n": 1}', '{"priority": "urgent"}', '["priority", "high"]', '"high"', "not json", ""):
        assert priority_of(payload) == "low", payload


def drain(q: PriorityQueue, worker: str, now: float) -> list[Job]:
    """Fetch and ack as one worker until the queue hands out nothing."""
    out = []
    while (job := q.fetch(worker, 0.01, now)) is not None:
        q.ack(worker, job, now)
        out.append(job)
    return out


def test_priority_hands_out_every_high_job_before_the_remaining_low_backlog(client: redis.Redis) -> None:
    q = PriorityQueue(client, "test:prio1:", SETTINGS)
    q.start_worker("w1", now=0.0)
    low = numbered("low", 20)
    q.enqueue(low)
    head = [q.fetch("w1", 0.01, now=0.0) for _ in range(2)]
    assert [j.id for j in head if j] == ["low00", "low01"]
    for job in head:
        assert job is not None
        q.ack("w1", job, now=0.0)
    by_keyword = numbered("hk", 3)
    q.enqueue(by_keyword, priority="high")
    by_payload = [Job(f"hp{i:02d}", json.dumps({"n": i, "priority": "high"})) for i in range(3)]
    q.enqueue(by_payload)
    odd = [Job("odd0", "not json"), Job("odd1", '{"priority": "urgent"}')]
    q.enqueue(odd)  # enqueued after the high ones, still low
    held = q.state().held
    assert {held[j.id] for j in by_keyword + by_payload} == {"pending:high"}
    assert {held[j.id] for j in low[2:] + odd} == {"pending:low"}
    assert q.backlog() == 18 + 6 + 2
    with pytest.raises(ValueError, match="priority"):
        q.enqueue([Job("bad")], priority="urgent")  # type: ignore[arg-type]

    order = ids(drain(q, "w1", now=1.0))
    # Every high job first, then the low backlog; first in, first out within each list.
    assert order == ids(by_keyword + by_payload + low[2:] + odd)
    assert q.backlog() == 0 and q.state().held == {}


def test_priority_recovery_returns_each_job_to_the_list_of_its_priority(client: redis.Redis) -> None:
    q = PriorityQueue(client, "test:prio2:", SETTINGS)
    q.enqueue([Job("l1"), Job("l2")])
    q.enqueue([Job("h1"), Job("h2")], priority="high")
    q.start_worker("w1", now=0.0)
    q.start_worker("w2", now=0.0)
    crashed = q.fetch("w1", 0.01, now=0.0)  # w1 "dies" holding h1
    failed = q.fetch("w2", 0.01, now=0.0)
    assert crashed is not None and failed is not None and (crashed.id, failed.id) == ("h1", "h2")
    q.fail("w2", failed, now=0.0)  # retry due within 0.125 s
    assert q.state().held == {"h1": "processing:w1", "h2": "delayed", "l1": "pending:low", "l2": "pending:low"}
    q.recover(now=11.0)  # the reaper takes h1 back, the retry mover moves h2: both to high
    state = q.state()
    assert state.held == {"h1": "pending:high", "h2": "pending:high", "l1": "pending:low", "l2": "pending:low"}
    assert (state.requeued, state.requeue_events) == ({"h1"}, 1)
    q.start_worker("w3", now=12.0)
    held = q.fetch("w3", 0.01, now=12.0)
    assert held is not None and held.id == "h1" and held.attempt == 2  # the reaper's give-back goes first
    q.stop_worker("w3", now=12.0)  # a graceful stop hands h1 back to high, too
    assert q.state().held["h1"] == "pending:high"
    order = drain(q, "w4", now=13.0)
    assert ids(order) == ["h2", "h1", "l1", "l2"]
    assert [j.attempt for j in order] == [2, 2, 1, 1]
    assert q.backlog() == 0


# -- crash runs with real workers --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("design", ["reliable-batch", "stream-batch"])
def test_batch_designs_lose_nothing_under_mid_job_kills(server_url: str, small: Scenario, design: str) -> None:
    run = run_designs(small, [design], Options(redis_url=server_url)).runs[0]
    c = run.counts
    assert_evidence_agrees(run)
    assert run.timings.drained
    assert (c.kills, c.kills_mid_job) == (5, 5), run.kills
    assert c.lost == 0 and c.stranded == 0 and c.dead_lettered == 0
    assert c.done == c.enqueued == 600
    assert c.interrupted == 5
    # A kill runs again the jobs of its batch that finished before it (not the one it interrupted):
    # at most batch_size - 1 per kill, and only after the kill, never alongside a live run.
    bound = (small.queue.batch_size - 1) * c.kills
    assert c.duplicated <= c.extra_executions <= bound
    assert c.duplicated_overlapping == 0
    # All five kills landing on the first job of their batch has odds of about 1e-5: the batch is real.
    assert c.duplicated > 0
    # Recovery gave back whole batches: at least the interrupted job, at most batch_size, per kill.
    assert c.kills <= c.requeue_events <= small.queue.batch_size * c.kills
    assert c.requeued >= len({k.job for k in run.kills})


@pytest.mark.slow
@pytest.mark.parametrize("design", ["reliable-batch", "stream-batch"])
def test_batch_designs_without_kills_run_every_job_exactly_once(valkey_url: str, small: Scenario, design: str) -> None:
    sc = small.replace(kills=0, batch_size=7)  # 600 is no multiple of 7: a short last batch
    run = run_designs(sc, [design], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert_evidence_agrees(run)
    assert c.done == c.enqueued == c.executions == 600
    assert (c.lost, c.duplicated, c.extra_executions, c.requeued, c.interrupted) == (0, 0, 0, 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("design", ["priority", "test_batch_priority:LastJobsHigh"])
def test_priority_loses_nothing_under_mid_job_kills(server_url: str, small: Scenario, design: str) -> None:
    run = run_designs(small, [design], Options(redis_url=server_url)).runs[0]
    c = run.counts
    assert_evidence_agrees(run)
    assert run.timings.drained
    assert (c.kills, c.kills_mid_job) == (5, 5), run.kills
    assert c.lost == 0 and c.stranded == 0 and c.dead_lettered == 0
    assert c.done == c.enqueued == 600
    # One job per worker, as in reliable: each kill interrupted one, recovery gave exactly that one back.
    assert c.interrupted == c.requeue_events == 5
    assert c.requeued == len({k.job for k in run.kills})
    assert c.duplicated == 0


def ledger_of(run: DesignRun) -> list[Execution]:
    assert run.workdir is not None
    ledger = Ledger(Path(run.workdir) / "ledger")
    for path in ledger.directory.glob("*.ledger"):
        ledger.path_for(path.stem)
    ledger.poll()
    ledger.close()
    return ledger.executions


def test_high_jobs_overtake_the_low_backlog_with_real_workers(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kills=0)
    run = run_designs(sc, ["test_batch_priority:LastJobsHigh"], Options(redis_url=valkey_url, keep=True)).runs[0]
    try:
        executions = ledger_of(run)
    finally:
        assert run.workdir is not None
        shutil.rmtree(run.workdir, ignore_errors=True)
        cleanup_keys(valkey_url, namespace(run.prefix))  # its keys and the session's lease (kept: --keep)
    assert_evidence_agrees(run)
    assert run.counts.done == run.counts.executions == 600
    assert len(executions) == 600

    def high(ex: Execution) -> bool:
        return int(ex.job) >= HIGH_FROM

    # Every high job was enqueued, last, before any worker started, and no job was given back: so a
    # worker that once got a low job found high empty, and never gets a high one after it.
    workers = {ex.worker for ex in executions}
    assert len(workers) == sc.workload.workers
    for worker in workers:
        mine = sorted((ex for ex in executions if ex.worker == worker), key=lambda ex: ex.start)
        flags = [high(ex) for ex in mine]
        assert flags == sorted(flags, reverse=True), f"{worker} ran a high job after a low one"
    # Across workers the ledger's clock reads a little after each fetch; still the last high job
    # starts before most of the low backlog, which FIFO would have run entirely before it.
    last_high = max(ex.start for ex in executions if high(ex))
    assert last_high < statistics.median(ex.start for ex in executions if not high(ex))
