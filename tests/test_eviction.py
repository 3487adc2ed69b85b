"""The eviction fault family (crashbench.faults.eviction) on real servers with a real memory limit: the
server evicts (or refuses) for real, and each test reads the server's own notifications itself, on a
subscription of its own, to check what crashbench counted."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from crashbench.errors import ScenarioError, UsageError
from crashbench.faults.eviction import NEIGHBOUR, parse_size
from crashbench.run import session
from crashbench.run.session import Options, run_designs
from crashbench.scenario import load, parse
from tests.conftest import _binaries

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def evicted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key the run's own server evicts, by a subscription of the test's, made before the run starts
    on the very server crashbench starts for it (session.broker_servers, wrapped: the real one)."""
    keys: list[str] = []
    real = session.broker_servers

    @contextlib.contextmanager
    def watched(*args: Any) -> Iterator[Any]:
        with real(*args) as broker:
            client = redis.Redis.from_url(broker.url)
            sub = client.pubsub()
            sub.subscribe("__keyevent@0__:evicted")
            while (m := sub.get_message(timeout=5)) is None or m["type"] != "subscribe":
                assert m is not None, "no subscribe reply"
            try:
                yield broker
            finally:
                sub.ping()
                while (m := sub.get_message(timeout=5)) is None or m["type"] != "pong":
                    assert m is not None, "no pong"
                    if m["type"] == "message":
                        keys.append(m["data"].decode())
                sub.close()
                client.close()

    monkeypatch.setattr(session, "broker_servers", watched)
    return keys


def _run(name: str, binary: str, **overrides: Any) -> Any:
    sc = load(name).replace(**overrides) if overrides else load(name)
    (run,) = run_designs(sc, ["naive"], Options(server_binary=binary)).runs
    return run


@pytest.mark.parametrize("binary", _binaries())
def test_allkeys_lru_evicts_the_queue_and_every_lost_job_is_counted_lost_to_eviction(
    binary: str, evicted: list[str]
) -> None:
    # 20 kB payloads, a 2 s limit, and enqueues over 2 s: the backlog outgrows the margin on a loaded machine
    # too, whose slowed producer the workers otherwise keep up with (the shipped 2 kB: nothing evicted, once,
    # beside a CPU hog), and whose late tick would otherwise let the producer enqueue everything (it catches up
    # on what is due before the limit is set, in the same tick) before the 0.5 s of producing were over.
    run = _run("eviction-allkeys-lru", binary, payload_bytes=20_000, limit_s=2.0, produce_s=2.0)
    c = run.counts
    # The test's own reading of the server: the naive queue's one list went, each time with its jobs.
    mine = [k for k in evicted if not k.startswith(NEIGHBOUR)]
    assert mine and all(k.endswith(":pending") for k in mine)
    recorded = [e.data["key"] for e in run.timeline.fault_events if e.what == "evicted"]
    assert sorted(recorded) == sorted(mine) and c.evicted_keys == len(mine) and c.evicted_neighbour == 0
    # Lost by the ledger alone: acknowledged, never started; every one of them counted lost to eviction.
    started = {ex.job for ex in run.timeline.executions}
    never = {j for e in run.timeline.enqueues if e.ok for j in e.ids} - started
    assert c.lost == len(never) == c.lost_to_eviction > 0
    assert set(run.jobs["lost_to_eviction"]) <= never
    assert not run.problems and c.unexpected == 0


@pytest.mark.parametrize("binary", _binaries())
def test_volatile_lru_takes_the_neighbour_s_keys_with_a_ttl_and_no_job(binary: str, evicted: list[str]) -> None:
    run = _run("eviction-volatile-lru", binary)
    c = run.counts
    assert evicted and all(k.startswith(NEIGHBOUR) for k in evicted)  # the test's own reading
    assert c.evicted_neighbour == len(evicted) and c.evicted_keys == 0
    assert c.lost == c.lost_to_eviction == 0 and c.done == c.enqueued and not run.problems


@pytest.mark.parametrize("binary", _binaries())
def test_noeviction_refuses_writes_enqueues_are_indeterminate_and_nothing_is_lost(
    binary: str, evicted: list[str]
) -> None:
    # 20 kB payloads over a 2 s limit, as above: on a loaded machine the shipped 2 kB once left the workers
    # keeping up with the slowed producer, and nothing was refused.
    run = _run("eviction-noeviction", binary, payload_bytes=20_000, limit_s=2.0, produce_s=2.0)
    c = run.counts
    assert evicted == []  # the test's own reading: the server evicted nothing
    refused = [e for e in run.timeline.enqueues if not e.ok]
    assert refused and c.indeterminate == sum(len(e.ids) for e in refused)
    assert c.oom_refused >= len(refused) and c.lost == 0 and c.evicted_keys == 0
    assert c.unconfirmed + c.recovered == c.indeterminate and c.worker_crashes == 0 and not run.problems


def test_bad_settings_are_one_line_each() -> None:
    def problem(entry: dict[str, Any]) -> str:
        with pytest.raises(ScenarioError) as caught:
            parse({"faults": [{"kind": "eviction", **entry}]}, "x.toml")
        return str(caught.value)

    assert "broker.maxmemory_policy must be one of allkeys-lru" in problem({"policy": "lru-please"})
    assert "broker.maxmemory must be bytes" in problem({"maxmemory": "lots"})
    assert "broker.maxmemory must be bytes" in problem({"maxmemory": 0})  # 0 is Redis's "no limit"
    assert "broker.fill must be one of neighbour, payloads" in problem({"fill": "sand"})
    assert "unknown key 'slot' for eviction" in problem({"slot": 1})
    assert parse_size("used+2mb") == (True, 2 * 1024**2) and parse_size("64MB") == (False, 64 * 1024**2)
    sc = parse({"faults": [{"kind": "eviction", "at": 0.4, "policy": "volatile-ttl", "duration": 2}]}, "x.toml")
    assert (sc.broker.fault, sc.broker.fault_at, sc.broker.maxmemory_policy, sc.broker.limit_s) == (
        "eviction", 0.4, "volatile-ttl", 2,
    )  # fmt: skip


def test_an_eviction_is_refused_on_a_server_crashbench_did_not_start(valkey_url: str) -> None:
    with pytest.raises(UsageError, match=r"a broker fault \(eviction\) reconfigures the server"):
        run_designs(load("eviction-noeviction"), ["naive"], Options(redis_url=valkey_url))
    proc = subprocess.run(
        [sys.executable, "-m", "crashbench", "run", "-d", "naive", "-s", "eviction-noeviction", "--redis-url",
         valkey_url], capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr


def test_the_gate_fails_a_design_that_loses_jobs_to_eviction() -> None:
    """The checker fires: a threshold of no loss under allkeys-lru is violated (exit 1), and says why."""
    proc = subprocess.run(
        [sys.executable, "-m", "crashbench", "check", "--designs", "naive", "-s", "eviction-allkeys-lru",
         "--server", str(_binaries()[1].values[0]), "-t", "lost_to_eviction=0"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lost_to_eviction == 0" in proc.stdout and "✗" in proc.stdout


def test_rq_s_evicted_ids_and_orphaned_job_hashes_are_counted_not_taken_for_a_contradiction(
    evicted: list[str],
) -> None:
    """RQ keeps a job's id in its lists and its body in a hash (rq:job:<Q>-<id>): eviction takes either
    alone. An id whose hash went is nothing RQ can run (lost, to eviction); a hash whose list went is held
    by nothing (held at "hash-only"). Both by the ledger and the server's own notifications, read here too;
    the harness's search, which finds those ids in the keys, raises no contradiction (job_of_disagrees)."""
    # 600 jobs of 20 kB: 30 of them waiting outgrow the 512 kB margin, however slowly a loaded machine enqueues
    # (300 once left RQ's workers keeping up in a clean clone's run, and nothing was evicted); enqueued over
    # 2 s, so that a late tick of a loaded machine's loop leaves some to enqueue under the limit.
    sc = load("eviction-allkeys-lru").replace(
        jobs=600, payload_bytes=20_000, limit_s=2.0, produce_s=2.0, drain_timeout=3
    )
    (run,) = run_designs(sc, ["rq"], Options()).runs
    c = run.counts
    assert not run.problems, run.problems
    mine = [k for k in evicted if not k.startswith(NEIGHBOUR)]
    assert mine and any(k.startswith("rq:job:") for k in mine)
    started = {ex.job for ex in run.timeline.executions}
    never = {j for e in run.timeline.enqueues if e.ok for j in e.ids} - started
    # Never started: lost, each one's hash or list evicted (the test's own subscription says), or held by
    # a hash alone, its list evicted (stranded at hash-only), or still waiting where RQ keeps it.
    held = run.timeline.located.held
    assert c.lost + len(held) == len(never) and c.lost == c.lost_to_eviction > 0
    assert all(any(k.startswith("rq:") and (j in k or ":queue:" in k) for k in mine) for j in run.jobs["lost"])
    # What is held is stranded; or, when a loaded machine's workers were still taking jobs as the drain's
    # bound came (63 in a CI run), undrained instead.
    assert c.stranded == (0 if run.timeline.cut_off else len(held)) and c.unexpected == 0
    assert not run.timeline.cut_off or c.undrained == len(held)
    if any(places == ["hash-only"] for places in held.values()):
        assert any(":queue:" in k or k.startswith("rq:wip:") for k in mine)  # what named them went
