"""Design mechanics on a real server, with the clock passed in so nothing sleeps."""

from __future__ import annotations

import time

import redis

from crashbench.designs import DesignSettings, Job
from crashbench.designs.reliable import ReliableQueue
from crashbench.designs.stream import StreamQueue

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
