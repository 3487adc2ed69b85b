"""Design mechanics on a real server, with the clock passed in so nothing sleeps."""

from __future__ import annotations

import time

import redis

from crashbench.designs.reliable import ReliableQueue
from crashbench.designs.stream import StreamQueue
from crashbench.model.queue import DesignSettings, Job

SETTINGS = DesignSettings(stale_after=10.0, recover_every=1.0, max_attempts=3)


def test_reaper_spares_fresh_workers_and_requeues_stale_ones(client: redis.Redis) -> None:
    q = ReliableQueue(client, "test:reap1:", SETTINGS)
    q.enqueue([Job("j1"), Job("j2")])
    q.start_worker("w1", now=100.0)
    job = q.fetch("w1", timeout=0.01, now=100.0)
    assert job is not None and job.id == "j1"
    q.recover(now=105.0)  # 5 s of silence < 10 s threshold: still alive
    assert q.state().held == {"j1": "processing:w1", "j2": "pending"}
    q.recover(now=111.0)  # 11 s of silence: dead, its job goes back to pending
    state = q.state()
    assert state.held == {"j1": "pending", "j2": "pending"}
    assert state.requeued == {"j1"} and state.requeue_events == 1
    # Requeued jobs go to the head: the retried job is fetched first.
    again = q.fetch("w2", timeout=0.01, now=112.0)
    assert again is not None and again.id == "j1"
    q.ack("w2", again, now=112.0)
    assert q.backlog() == 1


def test_reaper_dead_letters_after_max_attempts_deliveries(client: redis.Redis) -> None:
    q = ReliableQueue(client, "test:reap2:", SETTINGS)
    q.enqueue([Job("poison")])
    now = 0.0
    for delivery in range(1, 4):
        worker = f"w{delivery}"
        q.start_worker(worker, now)
        assert q.fetch(worker, 0.01, now) is not None  # delivered, then the worker "dies"
        now += 20
        q.recover(now)
    state = q.state()
    assert state.dead_lettered == {"poison"}
    assert state.held == {}
    assert state.requeue_events == 2  # deliveries 1 and 2 were retried, 3 was the last
    assert q.backlog() == 0


def test_stream_claims_idle_entries_and_dead_letters_by_delivery_count(client: redis.Redis) -> None:
    # min-idle is measured by the server's clock, so this test waits a few milliseconds for it.
    settings = DesignSettings(stale_after=0.002, recover_every=0.0, max_attempts=2)
    q = StreamQueue(client, "test:stream1:", settings)
    q.setup()
    q.enqueue([Job("s1")])
    first = q.fetch("c1", 0.01, now=0.0)  # delivery 1, then c1 "dies"
    assert first is not None and first.id == "s1"
    time.sleep(0.01)
    second = q.fetch("c2", 0.01, now=1.0)  # XAUTOCLAIM: delivery 2
    assert second is not None and second.id == "s1"
    assert q.state().held == {"s1": "pel:c2"}
    time.sleep(0.01)
    assert q.fetch("c3", 0.01, now=2.0) is None  # a third delivery would exceed max_attempts
    state = q.state()
    assert state.dead_lettered == {"s1"}
    assert state.held == {}
    assert (state.requeued, state.requeue_events) == ({"s1"}, 1)
    assert q.backlog() == 0


def test_a_failed_job_waits_in_delayed_until_its_backoff_has_passed(client: redis.Redis) -> None:
    settings = DesignSettings(stale_after=10.0, max_attempts=3, retry_base=1.0, retry_factor=4.0, retry_jitter=0.25)
    q = ReliableQueue(client, "test:retry1:", settings)
    q.enqueue([Job("t")])
    q.start_worker("w1", now=0.0)
    first = q.fetch("w1", 0.01, now=0.0)
    assert first is not None and first.attempt == 1
    q.fail("w1", first, now=100.0)  # retry due between 101.0 and 101.25
    assert q.state().held == {"t": "delayed"}
    q.recover(now=100.99)
    assert q.state().held == {"t": "delayed"}
    q.recover(now=101.26)
    assert q.state().held == {"t": "pending"}
    second = q.fetch("w1", 0.01, now=101.3)
    assert second is not None and second.attempt == 2
    q.fail("w1", second, now=200.0)  # second retry: 4 s later
    q.recover(now=203.9)
    assert q.state().held == {"t": "delayed"}
    q.recover(now=205.1)
    third = q.fetch("w1", 0.01, now=205.2)
    assert third is not None and third.attempt == 3
    q.fail("w1", third, now=300.0)  # third failure of max_attempts 3: dead-lettered as poison
    state = q.state()
    assert state.held == {} and state.dead_lettered == state.poisoned == {"t"}


def test_retry_delay_is_exponential_with_bounded_jitter() -> None:
    s = DesignSettings(retry_base=0.5, retry_factor=4.0, retry_jitter=0.25)
    assert [s.retry_delay(a, 0.0) for a in (1, 2, 3)] == [0.5, 2.0, 8.0]
    assert s.retry_delay(2, 0.999) < 2.0 * 1.25
