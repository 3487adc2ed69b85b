"""Stream consumers: the harness's own reading of a group's consumers (XINFO CONSUMERS), the stream
designs' cleanup of idle consumers that hold nothing, and stream-reuse, whose replacement takes its
slot's consumer name and re-reads that name's pending entries at once (and what that costs when the
name's previous holder is alive). Mechanics on a real server with the clock passed in; crash runs with
real processes and real signals."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis
from conftest import ROOT, assert_recounts
from designs_consumers import StreamKeepsConsumers
from rich.console import Console

from crashbench import scenario
from crashbench.designs.stream import StreamQueue
from crashbench.designs.stream_reuse import StreamReuseQueue
from crashbench.evidence import inspector
from crashbench.model.queue import SLOT_ENV, DesignSettings, Job
from crashbench.model.results import DesignRun, Result, group
from crashbench.model.spec import Scenario
from crashbench.model.thresholds import Threshold, evaluate
from crashbench.report import recount
from crashbench.report.render import result_table
from crashbench.run.session import Options, run_designs

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

SETTINGS = DesignSettings(stale_after=60.0, recover_every=0.0, max_attempts=3)


def jobs(prefix: str, n: int) -> list[Job]:
    return [Job(f"{prefix}{i:03d}", "{}") for i in range(n)]


def consumers(url: str, prefix: str) -> dict[str, inspector.Consumer]:
    """The group's consumers as the harness reads them, on a connection of its own."""
    raw = inspector.raw_client(url)
    try:
        return {c.name: c for c in inspector.take(raw, [prefix + "*"]).consumers()}
    finally:
        raw.close()


@pytest.fixture
def client(server_url: str) -> Iterator[redis.Redis]:
    """On both servers (Redis before 7.2 and Valkey count a consumer's idle time differently)."""
    c = redis.Redis.from_url(server_url, decode_responses=True)
    yield c
    c.close()


# -- the harness's reading and the cleanup -------------------------------------------------------------


def test_the_inspector_reads_every_consumer_with_its_pending_count_and_idle_time(
    client: redis.Redis, server_url: str
) -> None:
    q = StreamQueue(client, "test:cons1:", SETTINGS)
    q.setup()
    q.enqueue(jobs("a", 3))
    held = q.fetch("w0", 0.01, now=0.0)
    q.fetch("w1", 0.01, now=0.0)
    q.fetch("w1", 0.01, now=0.0)
    assert held is not None
    q.ack("w0", held, now=0.1)
    time.sleep(0.05)  # the idle time is the server's: let it pass
    seen = consumers(server_url, "test:cons1:")
    assert sorted(seen) == ["w0", "w1"]
    assert (seen["w0"].pending, seen["w1"].pending) == (0, 2)
    assert {c.key for c in seen.values()} == {"test:cons1:stream"} and {c.group for c in seen.values()} == {"workers"}
    assert all(50 <= c.idle_ms < 5000 for c in seen.values()), seen
    # Since its last successful read: a field from Redis 7.2 on (Valkey has it), none before.
    version = tuple(int(x) for x in str(client.info("server")["redis_version"]).split(".")[:2])
    assert all((c.inactive_ms is None) == (version < (7, 2)) for c in seen.values()), (version, seen)


def test_prune_deletes_only_consumers_with_nothing_pending_idle_past_the_bound(
    client: redis.Redis, server_url: str
) -> None:
    q = StreamQueue(client, "test:cons2:", SETTINGS)
    q.setup()
    q.enqueue(jobs("b", 3))
    got = {w: q.fetch(w, 0.01, now=0.0) for w in ("w0", "w1", "w2")}  # b000, b001, b002 in turn
    for w in ("w0", "w2"):  # they finish theirs and hold nothing; w1 still holds b001
        job = got[w]
        assert job is not None
        q.ack(w, job, now=0.1)
    time.sleep(0.05)
    assert q.prune_consumers(60_000) == []  # none idle that long
    assert q.prune_consumers(0, only="w1") == []  # one that holds a job is never deleted
    assert q.prune_consumers(0, only="w2") == ["w2"]
    assert q.prune_consumers(0) == ["w0"]
    assert sorted(consumers(server_url, "test:cons2:")) == ["w1"]
    assert q.state().held == {"b001": "pel:w1"}


def test_recover_runs_the_cleanup_with_stale_after_as_the_bound(client: redis.Redis, server_url: str) -> None:
    fast = DesignSettings(stale_after=0.02, recover_every=0.0)
    for cls, left in ((StreamQueue, []), (StreamKeepsConsumers, ["w0"])):
        prefix = f"test:cons3{cls.__name__}:"
        q = cls(client, prefix, fast)
        q.setup()
        q.enqueue(jobs("c", 1))
        job = q.fetch("w0", 0.01, now=0.0)
        assert job is not None
        q.ack("w0", job, now=0.0)
        time.sleep(0.03)
        q.recover(now=1.0)
        assert sorted(consumers(server_url, prefix)) == left, cls


# -- stream-reuse: the replacement takes the name ------------------------------------------------------


@pytest.fixture
def slot0(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is the worker of slot 0, as a forked worker is told by the supervisor."""
    monkeypatch.setenv(SLOT_ENV, "0")


def test_a_replacement_rereads_its_slots_pending_entry_at_once(client: redis.Redis, slot0: None) -> None:
    q = StreamReuseQueue(client, "test:reuse1:", SETTINGS)  # stale_after 60 s: XAUTOCLAIM takes nothing
    q.setup()
    q.enqueue(jobs("r", 3))
    first = q.fetch("w0", 0.01, now=0.0)
    assert first is not None and first.attempt == 1
    assert q.state().held[first.id] == "pel:slot0"  # the consumer is the slot, not the worker
    # w0 dies holding it; its replacement w4 in the same slot is a new instance, as in a new process.
    again = StreamReuseQueue(client, "test:reuse1:", SETTINGS)
    got = again.fetch("w4", 0.01, now=0.0)
    assert got is not None and (got.id, got.receipt, got.attempt) == (first.id, first.receipt, 2)
    st = again.state()
    assert (st.requeued, st.requeue_events) == ({first.id}, 1)
    assert again.ack("w4", got, now=0.1) is True
    nxt = again.fetch("w4", 0.01, now=0.2)  # the name's pending list is empty: new entries
    assert nxt is not None and nxt.id != first.id and nxt.attempt == 1

    # The control: stream's replacement is a new consumer and waits for the entry's idle time.
    s = StreamQueue(client, "test:reuse1s:", SETTINGS)
    s.setup()
    s.enqueue(jobs("s", 2))
    lost_holder = s.fetch("w0", 0.01, now=0.0)
    other = s.fetch("w4", 0.01, now=0.0)
    assert lost_holder is not None and other is not None and other.id != lost_holder.id


def test_a_reread_past_max_attempts_is_dead_lettered(client: redis.Redis, slot0: None) -> None:
    settings = dataclasses.replace(SETTINGS, max_attempts=2)
    q = StreamReuseQueue(client, "test:reuse2:", settings)
    q.setup()
    q.enqueue(jobs("d", 1))
    assert q.fetch("w0", 0.01, now=0.0) is not None  # delivery 1; then w0 dies
    second = StreamReuseQueue(client, "test:reuse2:", settings).fetch("w4", 0.01, now=0.0)  # delivery 2
    assert second is not None and second.attempt == 2
    assert StreamReuseQueue(client, "test:reuse2:", settings).fetch("w8", 0.01, now=0.0) is None  # a third: no
    st = q.state()
    assert st.dead_lettered == {"d000"} and st.held == {} and st.requeue_events == 1
    assert q.backlog() == 0


def test_two_live_consumers_with_one_name_run_one_job_twice_at_once(client: redis.Redis, slot0: None) -> None:
    q = StreamReuseQueue(client, "test:reuse3:", SETTINGS)
    q.setup()
    q.enqueue(jobs("t", 2))
    running = q.fetch("w0", 0.01, now=0.0)  # w0 is alive and inside the handler (or stopping, or paused)
    assert running is not None
    twin = StreamReuseQueue(client, "test:reuse3:", SETTINGS)  # its slot's replacement starts anyway
    dup = twin.fetch("w4", 0.01, now=0.0)
    assert dup is not None and dup.id == running.id  # no idle time protects a live holder's job
    # Whichever acks first acknowledges both deliveries; the other's ack then finds nothing.
    assert (q.ack("w0", running, now=0.1), twin.ack("w4", dup, now=0.1)) == (True, False)
    # And either one's graceful stop may delete the name the other still reads with, atomically only
    # when it holds nothing: the twin's next delivery is not dropped with the consumer.
    nxt = twin.fetch("w4", 0.01, now=0.2)
    assert nxt is not None
    q.stop_worker("w0", now=0.3)
    assert q.state().held == {nxt.id: "pel:slot0"}


# -- crash runs: real workers, real signals ---------------------------------------------------------


def few(**changes: object) -> Scenario:
    base = Scenario.of(
        name="consumers", jobs=300, job_ms=5, workers=3, kills=2, interval=0.1, stale_after=0.3,
        recover_every=0.05, drain_timeout=10,
    )  # fmt: skip
    return base.replace(**changes)


def test_the_cleanup_keeps_the_group_from_growing_with_the_kills(valkey_url: str, tmp_path: Path) -> None:
    kills = 5
    designs = ["designs_consumers:StreamKeepsConsumers", "stream"]
    # 1.5 s of work, three times the kills' span: late kills on a loaded machine still find a job
    result = run_designs(few(kills=kills, jobs=900), designs, Options(redis_url=valkey_url), kind="compare")
    keeps, stream = result.runs
    for run in result.runs:
        assert run.problems == [] and run.counts.lost == 0
        assert run.counts.kills_mid_job == kills
    # Without the cleanup every SIGKILLed consumer is left behind (its job claimed: nothing pending),
    # idle since before its death; the live ones deleted themselves on their graceful stop.
    assert keeps.counts.consumers == kills
    assert {c.name for c in keeps.consumers} == {k.worker for k in keeps.kills}
    assert all(c.pending == 0 and c.idle_ms >= 300 for c in keeps.consumers), keeps.consumers
    assert stream.counts.consumers == 0 and stream.consumers == []
    assert_recounts(result, tmp_path)
    console = Console(width=200, record=True)
    console.print(result_table(result))
    text = console.export_text()
    assert "consumers left" in text and "consumers left in the group: w" in text


def test_stream_reuse_recovers_at_restart_speed_and_leaves_no_consumer(valkey_url: str) -> None:
    sc = few(kills=3, stale_after=5.0, jobs=900)  # 1.5 s of work: late kills on a loaded machine find a job
    run = run_designs(sc, ["stream-reuse"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert run.problems == [] and (c.lost, c.duplicated, c.stranded) == (0, 0, 0)
    assert c.kills_mid_job == 3 and c.requeue_events == 3
    # Each killed job came back through its replacement's re-read, before XAUTOCLAIM (stale_after: 5 s
    # of idle time) could have taken it: the slot's name reached the worker process. (A bound far from
    # the restart's ~0.1 s, so that a loaded machine does not fail it.)
    assert run.timings.recovery_ms_max is not None and run.timings.recovery_ms_max < sc.queue.stale_after * 1000, (
        run.kills
    )
    assert c.consumers == 0


def test_stream_reuse_runs_a_gracefully_stopping_workers_job_again(valkey_url: str) -> None:
    # SIGTERM: the victim finishes its 1.5 s job while its slot's replacement, the same consumer, starts.
    # (With 300 ms jobs a loaded clean clone's two stops both came late in their jobs: each victim acked
    # before its replacement was ready, and nothing was re-read.) stale_after is past any job's length.
    sc = few(jobs=12, job_ms=1500, kills=2, interval=0.3, signal="SIGTERM", stale_after=5.0)
    stream, reuse = run_designs(sc, ["stream", "stream-reuse"], Options(redis_url=valkey_url), kind="compare").runs
    for run in (stream, reuse):
        assert run.problems == [] and run.counts.lost == 0 and run.counts.done == 12
        assert run.counts.interrupted == 0  # every stopped worker finished the job it was in
    assert (stream.counts.duplicated, stream.counts.requeue_events) == (0, 0)
    # Every re-read of a name's pending entry ran a job its live holder also finished, and the
    # replacement, ready in milliseconds, re-read it in at least one of the two stops.
    assert reuse.counts.duplicated == reuse.counts.requeue_events
    assert reuse.counts.requeue_events >= 1, reuse.kills
    # The name-reuse scenario's expectations say the same: each design meets its own, not the other's.
    expect = scenario.load(str(ROOT / "scenarios" / "name-reuse.toml")).expect
    assert failing(expect["stream"], stream) == failing(expect["stream-reuse"], reuse) == []
    assert failing(expect["stream"], reuse) == ["duplicated == 0", "redeliveries == 0"]
    assert failing(expect["stream-reuse"], stream) == ["redeliveries > 0"]


def failing(expected: Sequence[Threshold], run: DesignRun) -> list[str]:
    """The thresholds `run` violates."""
    return [t.rule() for t in expected if evaluate(t, run.design, [run], None).status == "fail"]


def test_the_stream_reuse_scenario_expects_it_to_recover_before_xautoclaim_could() -> None:
    # On the README's runs of the default scenario (make stream-consumers), which stream-reuse.toml
    # repeats: stream-reuse meets every expectation, and stream, whose jobs come back after
    # stale_after (1 s), only the one about recovery fails it.
    sc = scenario.load(str(ROOT / "scenarios" / "stream-reuse.toml"))
    default = scenario.load(str(ROOT / "scenarios" / "default.toml"))
    differ = {k for k, v in sc.to_dict().items() if default.to_dict().get(k) != v}
    assert differ == {"name", "description", "source", "designs", "expect"}  # the same runs
    expect = sc.expect["stream-reuse"]
    (path,) = (ROOT / "results" / "readme" / "stream-consumers").glob("*-compare-default-stream-stream-reuse.json")
    # Counted again from their timelines by today's code: the file predates the evidence counts.
    saved = Result.from_dict(json.loads(path.read_text()))
    again = [r.recounted for r in recount.recount(saved, recount.timelines_of(path, saved)) if r.recounted]
    assert len(again) == len(saved.runs)
    runs = group(again)
    assert {t.rule(): evaluate(t, "stream-reuse", runs["stream-reuse"], None).status for t in expect} == {
        t.rule(): "pass" for t in expect
    }
    assert [t.rule() for t in expect if evaluate(t, "stream", runs["stream"], None).status == "fail"] == [
        "recovery_max < 1000ms"
    ]
