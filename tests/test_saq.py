"""saq and saq:reliable: saq's own Worker under --worker-python (real server, real SIGKILL), and the
harness side of the adapter, which speaks saq's layout without saq (no server)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile

import pytest
import redis

from crashbench.designs import library_settings, load_design
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.spec import Scenario
from crashbench.model.stored import Snapshot, StoredKey
from crashbench.run.session import Options, run_designs
from tests.test_worker_python import arq_python

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

NO_SERVER = redis.Redis(host="127.0.0.1", port=1)  # the designs only build their keys and options here


@functools.cache
def _has_saq(python: str) -> bool:
    # Run outside any directory with a module named like the standard library's (saq has a types.py).
    with tempfile.TemporaryDirectory() as cwd:
        argv = [os.path.abspath(python), "-c", "import saq"]  # abspath, not resolve: a venv's python is a link
        return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=60).returncode == 0


def saq_python() -> str:
    python = arq_python()
    if not _has_saq(python):
        pytest.skip(f"{python} cannot import saq")
    return python


@pytest.mark.parametrize("design", ["saq", "saq:reliable"])
def test_saq_without_kills_runs_every_job(small: Scenario, design: str) -> None:
    # Every job is done, none is lost or failed. saq's sweep runs once as a worker starts (then every
    # timers["sweep"] s) and takes a job it finds in `active` with a status still "queued": one a worker
    # has just moved there and not yet marked active (tobymao/saq#124). It aborts it and, from a stale
    # copy with attempts 0, runs it again: a sequential duplicate, never two runs at once.
    # One worker running one job at a time: the start-up sweep then catches at most one job, and the
    # run waits at most 5 s on it. saq's default concurrency (10) is checked without a server below.
    sc = small.replace(jobs=60, kills=0, workers=1, concurrency=1)
    result = run_designs(sc, [design], Options(worker_python=saq_python()))
    run = result.runs[0]
    c = run.counts
    assert run.problems == []
    assert c.done == c.enqueued == 60 and c.executions == 60 + c.extra_executions
    assert (c.lost, c.stranded, c.failed, c.dead_lettered, c.duplicated_overlapping) == (0, 0, 0, 0, 0)
    assert "saq" in result.environment.libraries
    assert run.configuration["concurrency"] == 1  # queue.concurrency, handed to saq's Worker


def test_saq_reliable_runs_the_killed_jobs_again(small: Scenario) -> None:
    # One job per worker process (queue.concurrency), so each kill leaves exactly one job in `active`.
    # The heartbeat (1 s) finds it stuck, a sweep (every 1 s) aborts it, waits 5 s on its dead worker,
    # then retries it. Two workers keep the sweep's list short: it goes through it one job after another.
    sc = small.replace(jobs=150, job_ms=20, workers=2, kills=2, interval=0.15, concurrency=1, drain_timeout=20)
    run = run_designs(sc, ["saq:reliable"], Options(worker_python=saq_python())).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == 2 and c.interrupted == 2, run.kills
    assert (c.lost, c.failed, c.dead_lettered) == (0, 0, 0)
    assert run.jobs["undrained"] == run.jobs["failed"] == []
    # A sweep takes its job out of every list before it decides, and decides 5 s later in its worker's
    # memory: a kill landing on that worker meanwhile (the start-up sweep's, here) leaves the job in
    # its body alone, "aborting", which nothing delivers: stranded there.
    # Once, on a loaded machine, the body said "active" instead: saq's sweeps act on the copies of the
    # bodies they read as they began (tobymao/saq#124), so two sweeps and a kill interleave more ways
    # than one. Either way a body no list holds, which nothing delivers.
    assert c.stranded <= 1 and c.done + c.stranded == c.enqueued == 150, run.jobs["stranded"]
    assert c.stranded_at in ({}, {"no list (aborting)": 1}, {"no list (active)": 1})
    for k in run.kills:
        # Every other killed job ran again: after its sweep's 5 s wait, or sooner when the start-up
        # sweep had taken it already (it retries what it took, whether or not its worker died).
        if k.job not in run.jobs["stranded"]:
            assert k.recovered_after_ms is not None and k.recovered_after_ms < 30_000, run.kills


def test_config_warnings_and_configuration_follow_saq_defaults() -> None:
    def design(spec: str, longest: float, **options: object) -> object:
        return load_design(spec)(NO_SERVER, "p:", DesignSettings(longest_job=longest, options=dict(options)))

    plain = design("saq", 9.9)
    assert plain.config_warnings() == []  # type: ignore[attr-defined]
    assert library_settings(plain)[0] == {  # type: ignore[arg-type]  # the settings shown with the result
        "timeout_s": 10, "heartbeat_s": 0, "retries": 1, "concurrency": 10, "sweep_s": 60,
        "sweep_abort_wait_s": 5.0, "redelivery_s": 75.0,
    }  # fmt: skip
    assert plain.observe_window() == 10 + 60 + 5 + 10  # type: ignore[attr-defined]  # to its first decision
    [warning] = design("saq", 10.0).config_warnings()  # type: ignore[attr-defined]
    assert "job timeout 10 s" in warning and "cancels" in warning
    assert design("saq", 30.0, timeout=60).config_warnings() == []  # type: ignore[attr-defined]

    reliable = design("saq:reliable", 10.0)
    config = reliable.configuration()  # type: ignore[attr-defined]
    assert config["timeout_s"] > 10 and config["heartbeat_s"] == 1 and config["retries"] == 3
    assert config["sweep_s"] == 1 and reliable.config_warnings() == []  # type: ignore[attr-defined]
    assert design("saq:reliable", 10.0, timeout=5).config_warnings() != []  # type: ignore[attr-defined]


def _key(name: str, kind: str, *items: str | bytes) -> StoredKey:
    return StoredKey(name, kind, items=[i.encode() if isinstance(i, str) else i for i in items])


def test_locate_reads_saq_lists_and_job_statuses() -> None:
    d = load_design("saq")(NO_SERVER, "crashbench:r:1-saq:", DesignSettings())
    q, ids = "saq:crashbench:r:1-saq:", "saq:job:crashbench:r:1-saq:crashbench:r:1-saq:"

    def body(job: str, **fields: object) -> StoredKey:
        return _key(ids + job, "string", json.dumps({"function": "crashbench_handle", "key": job, **fields}))

    neighbour = "saq:job:crashbench:r:10-saq:crashbench:r:10-saq:000009"
    keys = [
        # queued, active: held where listed; 000003 is queued with its body gone (saq skips it)
        _key(q + "queued", "list", ids + "000001", ids + "000003"),
        _key(q + "active", "list", ids + "000002"),
        # incomplete lists every job not ended; alone it holds a retry waiting for its delay (000004)
        # or a job nothing will deliver (000005)
        _key(q + "incomplete", "zset", *(ids + j for j in ("000001", "000002", "000003", "000004", "000005"))),
        body("000001", status="queued"), body("000002", status="active"),
        body("000004", status="queued", retry_delay=1.0), body("000005", status="queued"),
        # ended: saq keeps the body for its ttl with the outcome
        body("000006", status="failed"), body("000007", status="aborted"), body("000008", status="complete"),
        # taken out of every list by a sweep, in its body alone: held there (a sweep still deciding it
        # keeps the drain going, crashbench.designs.saqlib.backlog; one whose worker died, never decides)
        body("000010", status="aborting"),
        _key(neighbour, "string", json.dumps({"status": "failed"})),  # another run's: never ours
        _key(q + "stats", "zset", q + "worker_info:w1"), _key(q + "worker_info:w1", "string", "{}"),
    ]  # fmt: skip
    found = d.locate(Snapshot({k.name: k for k in keys}))
    assert found.held == {
        "000001": ["queued"], "000002": ["active"], "000004": ["incomplete"], "000005": ["incomplete"],
        "000010": ["no list (aborting)"],
    }  # fmt: skip
    assert found.delayed == {"000004"}
    assert found.failed == {"000006", "000007"}
    assert found.succeeded == {"000008"}
    assert found.dead == {}
    assert d.key_patterns() == [f"saq:{d.prefix}*", f"saq:job:{d.prefix}{d.prefix}*", f"saq:abort:{d.prefix}*"]


def test_backlog_waits_for_a_job_a_sweep_has_in_hand(client: redis.Redis) -> None:
    # A sweep takes a job out of every list, waits 5 s on its worker (the abort key lives as long),
    # then retries or finishes it: the run must not end in between. One whose sweeper died stays
    # "aborting" forever, in no list: the queue no longer holds it.
    d = load_design("saq")(client, f"crashbench:{os.getpid()}:1-saq:", DesignSettings())
    d.enqueue([Job("000001"), Job("000002")])
    assert d.backlog() == 2
    keys, saq_id = d.keys, d.ids + "000001"  # type: ignore[attr-defined]
    try:
        client.delete(keys["incomplete"])  # a job a stale sweep retried, then finished: only in `queued`
        assert d.backlog() == 2
        for job in ("000001", "000002"):  # what sweep + abort leave: out of every list, "aborting"
            client.delete(keys["queued"], keys["incomplete"])
            client.set(d.ids + job, json.dumps({"status": "aborting"}))  # type: ignore[attr-defined]
        client.set(f"saq:abort:{d.prefix}000001", "swept", ex=5)
        assert d.backlog() == 1
        client.delete(f"saq:abort:{d.prefix}000001")  # the key expired; the sweep decides in a few ms
        assert d.backlog() == 2
        d._aborting = (0, 0.0)  # type: ignore[attr-defined]
        d._aborting_since[saq_id] -= 10.5  # type: ignore[attr-defined]  # 000001 undecided 10.5 s: orphaned
        assert d.backlog() == 1
        # Nothing delivers it, but its body is in Redis: held there (stranded), in state() as in locate.
        assert d.state().held == {"000001": "no list (aborting)", "000002": "no list (aborting)"}
        # Finished aborted with retries left: the sweep retries it next; with none left, it is over.
        client.set(d.ids + "000002", json.dumps({"status": "aborted", "retries": 3, "attempts": 1}))  # type: ignore[attr-defined]
        d._aborting = (0, 0.0)  # type: ignore[attr-defined]
        assert d.backlog() == 1
        client.set(d.ids + "000002", json.dumps({"status": "aborted", "retries": 3, "attempts": 3}))  # type: ignore[attr-defined]
        d._aborting = (0, 0.0)  # type: ignore[attr-defined]
        assert d.backlog() == 0
    finally:
        client.delete(*client.keys(f"saq*{d.prefix}*"))
