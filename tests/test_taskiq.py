"""taskiq on taskiq-redis: its own Receiver in each worker (real server, real SIGKILL), and its settings."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import redis

from crashbench.designs import load_design
from crashbench.evidence import inspector
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from tests.test_libraries import installed

pytestmark = [installed("taskiq_redis"), pytest.mark.slow]  # a real library: not in make test-fast


@pytest.mark.parametrize("design", ["taskiq", "taskiq:stream", "taskiq:reliable"])
def test_taskiq_without_kills_runs_every_job_exactly_once_and_leaves_no_key(
    client: redis.Redis, valkey_url: str, small: Scenario, design: str
) -> None:
    # taskiq's shipped concurrency: 100 async tasks, the sync handler in the default thread pool. On a
    # server crashbench does not own: every key taskiq wrote is under the run's prefix, and is gone.
    before = set(client.scan_iter())
    run = run_designs(small.replace(jobs=60, kills=0), [design], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.done == c.enqueued == c.executions == 60
    assert (c.lost, c.duplicated, c.stranded, c.failed) == (0, 0, 0, 0)
    assert run.configuration["max_async_tasks"] == 100
    assert set(client.scan_iter()) == before


def _killed(small: Scenario, design: str) -> tuple:
    # One handler per worker, so that each kill interrupts one job and the worker holds no other:
    # max_async_tasks 1 also stops the Receiver taking messages ahead of the one it runs.
    sc = small.replace(jobs=500, job_ms=20, kills=3, interval=0.15, concurrency=1, drain_timeout=8)
    run = run_designs(sc, [design], Options()).runs[0]
    assert run.problems == []
    assert run.counts.kills_mid_job == 3, run.kills
    assert run.configuration["concurrency"] == 1
    return run, run.counts, {k.job for k in run.kills}


def test_taskiq_list_broker_loses_exactly_the_killed_jobs(small: Scenario) -> None:
    # BRPOP took the message: nothing in Redis remembers a job while it runs.
    run, c, killed = _killed(small, "taskiq")
    assert c.lost == 3 and set(run.jobs["lost"]) == killed
    assert (c.stranded, c.duplicated) == (0, 0)
    assert c.done == c.enqueued - 3


def test_taskiq_reliable_claims_the_killed_jobs_back(small: Scenario) -> None:
    # The dead consumer's entries stay pending; once idle for idle_timeout (~1 s here), a live
    # worker's claim pass, which follows each read of a new entry, takes them while 2.5 s of work remain.
    run, c, killed = _killed(small, "taskiq:reliable")
    assert (c.lost, c.stranded) == (0, 0)
    assert c.done == c.enqueued
    assert all(k.recovered_after_ms is not None for k in run.kills)
    assert set(run.duplicates) <= killed  # only a killed job can have run again after a completion


def _located(design: Any, raw: redis.Redis) -> dict[str, list[str]]:
    found = design.locate(inspector.take(raw, design.key_patterns()))
    assert set(design.state().held) == set(found.held)  # the design's own reading agrees
    return {job: sorted(places) for job, places in found.held.items()}


def test_taskiq_locates_jobs_in_the_list_and_the_stream_pel(client: redis.Redis, valkey_url: str) -> None:
    jobs = ["000001", "000002", "000003"]
    raw = inspector.raw_client(valkey_url)
    prefixes: list[str] = []
    try:
        for spec, waiting in (("taskiq", "queue"), ("taskiq:stream", "stream")):
            prefixes += [f"t:{secrets.token_hex(4)}:", f"t:{secrets.token_hex(4)}:"]
            neighbour = load_design(spec)(client, prefixes[-2], DesignSettings())
            neighbour.enqueue([Job("900001")])  # another run's job: never located
            d: Any = load_design(spec)(client, prefixes[-1], DesignSettings())
            d.enqueue([Job(j) for j in jobs])
            assert _located(d, raw) == {j: [waiting] for j in jobs} and d.backlog() == 3
            if spec == "taskiq":
                client.rpop(d.queue)  # popped by a worker (BRPOP takes from the right): gone
                assert _located(d, raw) == {j: ["queue"] for j in jobs[1:]}
                continue
            # Read by consumer c1 (pending until acked), one of the two then acked.
            read = client.xreadgroup(d.group, "c1", {d.stream: ">"}, count=2)
            client.xack(d.stream, d.group, read[0][1][0][0])
            assert _located(d, raw) == {"000002": ["pel:c1"], "000003": ["stream"]} and d.backlog() == 2
    finally:
        raw.close()
        for prefix in prefixes:
            for key in client.scan_iter(match=prefix + "*"):
                client.delete(key)


def test_taskiq_stream_timeouts_against_the_longest_job() -> None:
    # No server needed: the warnings and timeouts are computed from settings.
    client = redis.Redis(host="127.0.0.1", port=1)

    def design(spec: str, longest: float, concurrency: int = 0) -> Any:
        return load_design(spec)(client, "p:", DesignSettings(longest_job=longest, concurrency=concurrency))

    def idle_warning(d: Any) -> bool:
        return any("idle_timeout 600 s is not above the longest job" in w for w in d.config_warnings())

    assert idle_warning(design("taskiq:stream", 700.0))
    assert idle_warning(design("taskiq:stream", 600.0))  # equal is not above
    assert not idle_warning(design("taskiq:stream", 500.0))
    # ... and with one task per thread, nothing else waits long enough to be claimed either.
    assert design("taskiq:stream", 500.0, concurrency=4).config_warnings() == []
    # 100 async tasks on at most 32 threads: a prefetched message waits for a thread, idle all along.
    assert any("can wait up to" in w for w in design("taskiq:stream", 300.0).config_warnings())

    for longest in (0.01, 700.0, 5000.0):
        reliable = design("taskiq:reliable", longest)
        assert reliable.idle_timeout() > longest
        assert reliable.configuration()["idle_timeout_s"] > longest
        assert not idle_warning(reliable)
        assert reliable.observe_window() >= min(300.0, reliable.idle_timeout())
    assert design("taskiq:stream", 1.0).idle_timeout() == 600.0
