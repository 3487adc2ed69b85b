"""Queue libraries under the same faults, running their own workers (real server, real SIGKILL)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from crashbench import scenario
from crashbench.designs import load_design
from crashbench.errors import UsageError
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from tests.conftest import assert_recounts

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow


def installed(module: str) -> pytest.MarkDecorator:
    """Library tests run where the library is (the test extra installs them all)."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


@installed("rq")
@pytest.mark.parametrize("design", ["rq", "rq:reliable"])
def test_rq_without_kills_runs_every_job_exactly_once(small: Scenario, design: str) -> None:
    sc = small.replace(jobs=60, kills=0)
    run = run_designs(sc, [design], Options()).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.done == c.enqueued == c.executions == 60
    assert (c.lost, c.duplicated, c.stranded, c.failed) == (0, 0, 0, 0)


@installed("rq")
def test_rq_counts_a_job_whose_work_horse_alone_was_killed_as_failed(small: Scenario) -> None:
    # --kill-target child: only the process running the job dies; RQ's worker sees its horse die and
    # moves the job to its FailedJobRegistry, which crashbench counts as failed, not done.
    sc = small.replace(jobs=200, job_ms=20, kills=3, interval=0.15, drain_timeout=5, kill_target="child")
    run = run_designs(sc, ["rq"], Options()).runs[0]
    c = run.counts
    assert run.problems == []
    assert [(k.target, k.mid_job, k.replacement) for k in run.kills] == [("child", True, None)] * 3
    assert c.failed == 3 and set(run.jobs["failed"]) == {k.job for k in run.kills}
    assert (c.lost, c.stranded, c.duplicated) == (0, 0, 0)
    assert c.done == c.enqueued - 3


@installed("rq")
def test_library_designs_refuse_a_server_crashbench_does_not_own(valkey_url: str, small: Scenario) -> None:
    with pytest.raises(UsageError, match="outside crashbench's namespace"):
        run_designs(small, ["rq"], Options(redis_url=valkey_url))


@pytest.mark.parametrize(
    "design",
    [
        pytest.param(d, marks=installed(d.split(":")[0]))
        for d in ("celery", "celery:acks-late", "dramatiq", "dramatiq:reliable")
    ],
)
def test_namespaced_libraries_run_every_job_once_and_leave_no_key(
    client: redis.Redis, valkey_url: str, small: Scenario, design: str
) -> None:
    before = set(client.scan_iter())
    sc = small.replace(jobs=100, kills=0)
    run = run_designs(sc, [design], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.done == c.enqueued == c.executions == 100
    assert (c.lost, c.duplicated, c.stranded) == (0, 0, 0)
    assert set(client.scan_iter()) == before  # every key was under crashbench's prefix, and is gone


@installed("celery")
def test_celery_as_installed_loses_the_running_task_and_parks_prefetched_ones(small: Scenario, tmp_path: Path) -> None:
    # Early ack: the task a killed worker was running is acked already, so it is gone (kombu acks
    # asynchronously, so now and then the ack has not landed and the task is still in `unacked`).
    # Tasks the worker had acked and handed to its pool but not started are gone too, so losses can
    # exceed the kills; messages it had prefetched wait in `unacked` for the one-hour visibility timeout.
    # The run waits out its whole window on them once no handler starts: 2 s show that as well as 5.
    sc = small.replace(job_ms=20, kills=3, interval=0.15, drain_timeout=2)
    result = run_designs(sc, ["celery"], Options())
    assert_recounts(result, tmp_path)  # a library worker's tree and its stranded tasks, from the timeline
    run = result.runs[0]
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == 3, run.kills
    killed = {k.job for k in run.kills}
    assert killed <= set(run.jobs["lost"]) | set(run.jobs["stranded"])  # each killed task: gone or parked
    assert set(c.stranded_at) <= {"unacked", "queue"}
    assert c.duplicated == 0


@installed("huey")
@pytest.mark.parametrize("threads", [1, 3])
def test_huey_loses_exactly_the_tasks_a_killed_worker_was_running(small: Scenario, threads: int) -> None:
    # huey RPOPs the task: nothing in Redis remembers it while it runs, as with the naive design. With
    # 3 worker threads a kill takes every task its threads were running: each kill record lists them,
    # and every one of them is lost and counted as never run again.
    sc = small.replace(job_ms=20, kills=3, interval=0.15, drain_timeout=5, concurrency=threads)
    run = run_designs(sc, ["huey"], Options()).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == 3, run.kills
    killed = [j for k in run.kills for j in k.jobs]
    assert all(k.job == k.jobs[-1] and len(k.jobs) <= threads for k in run.kills)
    assert c.interrupted == c.unrecovered == len(killed) == len(set(killed))
    assert set(killed) <= set(run.jobs["lost"]) and (threads == 1 or len(killed) > 3)
    # Under load, another thread of the victim may have RPOPped a task and not yet started it: lost as
    # well, and never run at all (no execution in any ledger); at most one per other thread per kill.
    taken = set(run.jobs["lost"]) - set(killed)
    assert c.lost == len(killed) + len(taken) and len(taken) <= (threads - 1) * c.kills
    assert run.timeline is not None and not {ex.job for ex in run.timeline.executions} & taken
    assert (c.stranded, c.duplicated) == (0, 0)
    assert c.done == c.enqueued - c.lost


@installed("huey")
def test_huey_without_kills_runs_every_job_exactly_once(small: Scenario) -> None:
    run = run_designs(small.replace(jobs=100, kills=0), ["huey"], Options()).runs[0]
    assert run.problems == []
    assert run.counts.done == run.counts.executions == 100


# Plain "celery" configured through [library.celery] exactly like celery:acks-late: it must then behave
# like it (nothing lost), which only happens if the settings reached Celery.
CELERY_AS_ACKS_LATE = {
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "broker_transport_options": {"visibility_timeout": 0.3, "unacked_restore_interval": 1,
                                 "unacked_restore_throttle": 1},
}  # fmt: skip


@pytest.mark.parametrize(
    ("design", "library"),
    [
        pytest.param("dramatiq:reliable", {}, marks=installed("dramatiq"), id="dramatiq:reliable"),
        pytest.param("celery:acks-late", {}, marks=installed("celery"), id="celery:acks-late"),
        pytest.param("celery:threads", {}, marks=installed("celery"), id="celery:threads"),
        pytest.param("celery:solo", {}, marks=installed("celery"), id="celery:solo"),
        pytest.param(
            "celery", {"celery": CELERY_AS_ACKS_LATE}, marks=installed("celery"), id="celery-with-library-settings"
        ),
    ],
)
def test_reliable_library_configurations_get_the_killed_jobs_back(small: Scenario, design: str, library: dict) -> None:
    # Dramatiq at its shipped 8 threads a worker, with enough jobs that every kill finds handlers
    # running. Celery with one pool child: at two, 1 run in about 20 under the full suite lost a job
    # (not reproduced alone in 16 runs; kombu's BRPOP-then-unacked window is the suspect).
    dramatiq = design.startswith("dramatiq")
    sc = small.replace(
        jobs=2000 if dramatiq else small.workload.jobs, job_ms=20, kills=3, interval=0.15, stale_after=0.3,
        drain_timeout=10, library=library, concurrency=0 if dramatiq else 1,
    )  # fmt: skip
    run = run_designs(sc, [design], Options()).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == 3, run.kills
    assert (c.lost, c.stranded) == (0, 0)
    assert c.done == c.enqueued
    assert all(k.recovered_after_ms is not None for k in run.kills)
    # Every handler a kill interrupted (up to 8 with Dramatiq's threads) is on its record, and came back.
    assert sum(len(k.jobs) for k in run.kills) == c.interrupted and c.unrecovered == 0


@installed("rq")
@installed("celery")
@installed("dramatiq")
def test_default_observation_window_follows_each_library_documented_timing(small: Scenario) -> None:
    # No server needed: a window is computed from settings. stale_after is 0.3 s in `small`, below the
    # timeout the reliable configurations size from its longest job (2 x longest + 1 s).
    client = redis.Redis(host="127.0.0.1", port=1)
    sc = small.replace(drain_timeout=None)
    timeout = 2 * sc.workload.longest_job_s + 1
    windows = {d: load_design(d)(client, "p:", sc.settings(d)).observe_window() for d in (
        "reliable", "rq", "rq:reliable", "celery", "celery:acks-late", "dramatiq", "dramatiq:reliable",
        "arq", "arq:reliable",
    )}  # fmt: skip
    assert windows == {
        "reliable": 30.0,  # the built-in designs recover within stale_after + recover_every
        "rq": 300.0,  # 30 + 60 + 600 s documented: capped
        "rq:reliable": 1 + 60 + 1 + 1 + 10,  # heartbeat TTL, maintenance, an idle dequeue (worker_ttl - 15)
        "celery": 300.0,  # visibility_timeout 1 h + kombu's sweep (10 s x throttle 10): capped
        "celery:acks-late": pytest.approx(timeout + 1 + 10),
        "dramatiq": 300.0,  # heartbeat 60 s + a maintenance pass expected within 1,000 commands: capped
        "dramatiq:reliable": pytest.approx(timeout + 1 + 10),
        "arq": 300.0,  # job_timeout 300 + 10 s: capped
        "arq:reliable": pytest.approx(timeout + 10 + 0.5 + 10),
    }
    # A user's own late-ack settings with kombu's sweep left as shipped: it scans Redis every 10th
    # tick of a 10 s timer, so a message comes back up to 5 + 100 s after its delivery.
    own = dataclasses.replace(sc, library={"celery": {"broker_transport_options": {"visibility_timeout": 5}}})
    assert load_design("celery")(client, "p:", own.settings("celery")).observe_window() == 5 + 10 * 10 + 10


@pytest.mark.parametrize(
    "design",
    [
        pytest.param("rq:reliable", marks=installed("rq")),
        pytest.param("dramatiq:reliable", marks=installed("dramatiq")),
    ],
)
def test_library_retries_tell_the_handler_its_attempt(small: Scenario, design: str) -> None:
    # A transient job fails on its first attempt only: the library's retry must run it as attempt 2,
    # so it is done, not failed again and again.
    sc = small.replace(jobs=60, kills=0, transient_rate=0.2, retry_base=0.05, drain_timeout=20)
    run = run_designs(sc, [design], Options()).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.transient_jobs > 0
    assert (c.failed_attempts, c.retried) == (c.transient_jobs, c.transient_jobs)
    assert c.done == c.enqueued == 60 and (c.failed, c.lost, c.dead_lettered) == (0, 0, 0)


@installed("rq")
def test_rq_leaves_a_killed_job_in_its_started_registry_even_with_sighup_ignored(small: Scenario) -> None:
    """What RQ 2.x does as installed: the work horse dies with the job, which stays in rq:wip until its
    heartbeat expires (>= 60 s) and a maintenance pass finds it; within a short window it is stranded.
    With SIGHUP ignored (nohup, a CI runner): were the frozen worker killed before its horse, the horse's
    orphaned process group would get SIGHUP and SIGCONT, wake, and finish the job it was meant to die
    in. The tree is killed leaves first, so every kill hits: each leaves exactly its job interrupted."""
    # 500 jobs: work left for the eighth kill (each waits for its victim's next horse) when loaded, and
    # gone well within the drain's bound (ten 3 s windows after the last kill), so it is not cut off.
    sc = small.replace(jobs=500, job_ms=20, kills=8, interval=0.1, drain_timeout=3)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # inherited by the workers and their horses
    try:
        run = run_designs(sc, ["rq"], Options()).runs[0]
    finally:
        signal.signal(signal.SIGHUP, previous)
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == c.interrupted == c.stranded == 8, run.kills
    assert c.stranded_at == {"started": 8} and set(run.jobs["stranded"]) == {k.job for k in run.kills}
    assert (c.lost, c.duplicated, c.failed) == (0, 0, 0) and c.done == c.enqueued - 8
    assert not run.timings.drained  # the window ran out with the jobs still held


@installed("rq")
@installed("celery")
@installed("dramatiq")
def test_reliable_configurations_size_their_timeouts_above_the_longest_job_and_warn_when_set_below(
    small: Scenario,
) -> None:
    # No server needed. 3 s jobs: the sized timeouts (2 x 3 + 1 = 7 s) leave nothing to warn about;
    # a user's own timeout at or below the longest job is named before the run.
    client = redis.Redis(host="127.0.0.1", port=1)
    sc = small.replace(job_ms=3000)

    def design(name: str, **library: Any) -> Any:
        return load_design(name)(client, "p:", dataclasses.replace(sc, library={name: library}).settings(name))

    for name in ("rq:reliable", "celery:acks-late", "dramatiq:reliable", "arq:reliable"):
        assert design(name).config_warnings() == [], name
    assert design("celery:acks-late").configuration()["visibility_timeout_s"] == 7
    assert design("dramatiq:reliable").configuration()["heartbeat_timeout_s"] == 7
    assert design("arq:reliable").configuration()["job_timeout_s"] == 7
    too_short = {
        "celery:acks-late": design("celery:acks-late", broker_transport_options={"visibility_timeout": 1}),
        "dramatiq:reliable": design("dramatiq:reliable", heartbeat_timeout=3000),
        "arq:reliable": design("arq:reliable", job_timeout=1),
        "rq:reliable": design("rq:reliable", job_timeout=2),
    }
    for name, d in too_short.items():
        assert [w.split(":")[0] + ":" + w.split(":")[1] for w in d.config_warnings()] == [name], name
    # As installed, arq's 300 s job timeout cancels a longer job.
    long = sc.replace(job_ms=400_000)
    arq = load_design("arq")(client, "p:", long.settings("arq"))
    assert "job_timeout 300 s is not above the longest job (400 s)" in arq.config_warnings()[0]


@installed("dramatiq")
@installed("celery")
def test_libraries_run_their_shipped_concurrency_unless_told_otherwise(small: Scenario) -> None:
    client = redis.Redis(host="127.0.0.1", port=1)

    def concurrency(name: str, sc: Scenario) -> int:
        return load_design(name)(client, "p:", sc.settings(name)).configuration()["concurrency"]

    shipped = {d: concurrency(d, small) for d in ("dramatiq", "arq", "huey", "rq", "celery")}
    cpus = os.cpu_count() or 1
    # arq's max_jobs is 10; its sync handler then runs in the loop's default executor, min(32, CPUs + 4).
    assert shipped == {"dramatiq": 8, "arq": min(10, cpus + 4), "huey": 1, "rq": 1, "celery": cpus}
    assert load_design("arq")(client, "p:", small.settings("arq")).configuration()["max_jobs"] == 10
    assert concurrency("dramatiq", small.replace(concurrency=2)) == 2
    assert concurrency("arq", dataclasses.replace(small, library={"arq": {"max_jobs": 3}})) == 3


def test_the_readme_library_table_is_what_its_result_files_give() -> None:
    """The library table of docs/findings/libraries.md is regenerated from results/readme/libraries and
    libraries-throughput (make libraries), its cluster column and the errors under it from
    results/readme/libraries-cluster
    (make libraries-cluster)."""
    root = Path(__file__).resolve().parent.parent
    dirs = [str(root / "results" / "readme" / d) for d in ("libraries", "libraries-throughput", "libraries-cluster")]
    out = subprocess.run(
        [sys.executable, str(root / "lab" / "library_table.py"), *dirs], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    readme = (root / "docs" / "findings" / "libraries.md").read_text()
    rows = [line for line in out if line.startswith("|")]
    assert rows[0].endswith("| on a cluster (3 primaries) |") and len(rows) == 2 + 14
    assert all(row in readme for row in rows)
    errors = [line for line in out if line.startswith("- `")]  # each unsupported design's error, in full
    assert errors and all(line in readme for line in errors)
    assert sum("| unsupported: " in row for row in rows) == len(errors)


@installed("huey")
def test_huey_loses_what_a_sigterm_interrupts_and_its_recipe_puts_it_back(small: Scenario) -> None:
    # SIGTERM is huey's hard stop (coleifer/huey#796): the consumer emits SIGNAL_INTERRUPTED for the task
    # it was running and exits. As installed that task is gone; huey:requeue's handler enqueues it again.
    # Jobs of 200 ms: a SIGTERM finds its task well inside it, whatever the load (at 20 ms, it may be done).
    # Six SIGTERMs: beside a CPU-hungry process all three of an earlier three once let their tasks finish.
    sc = small.replace(jobs=80, job_ms=200, kills=6, interval=0.3, signal="SIGTERM", drain_timeout=10)
    result = run_designs(sc, ["huey", "huey:requeue"], Options())
    plain, requeue = result.runs
    assert plain.problems == [] and requeue.problems == []
    assert plain.counts.kills_mid_job == requeue.counts.kills_mid_job == 6

    # A task a SIGTERM interrupted (its execution open in the ledger) is lost as installed, and run again
    # with the recipe. Not every SIGTERM interrupts one (the task may finish as the consumer exits), and a
    # task the worker thread pops while the consumer shuts down is lost either way, without a start.
    def interrupted(run: DesignRun) -> set[str]:
        assert run.timeline is not None
        return {ex.job for ex in run.timeline.executions if ex.end is None}

    assert interrupted(plain) and interrupted(plain) <= set(plain.jobs["lost"])
    assert interrupted(requeue) and not interrupted(requeue) & set(requeue.jobs.get("lost", []))
    assert requeue.counts.stranded == 0
    assert requeue.counts.redelivered >= 1  # an interrupted task ran again


@installed("rq")
def test_library_workers_that_exit_on_a_lost_server_are_the_broker_fault_s_not_a_reason_to_abort(
    small: Scenario,
) -> None:
    # RQ's workers exit on a ConnectionError while the server is down (rq/rq#1846's setting): more than
    # 2 x workers of them. They are counted and respawned; the run goes on to its counts instead of aborting.
    sc = scenario.load("broker-kill-aof-everysec")
    sc = sc.replace(jobs=200, workers=2, downtime=1.0, drain_timeout=8)
    run = run_designs(sc, ["rq"], Options()).runs[0]
    assert run.broker_fault is not None and run.broker_fault.back_at is not None
    assert run.counts.worker_crashes > 2 * sc.workload.workers  # what used to abort the run (exit 4)
    assert run.problems == [] and run.counts.enqueued == 200 and run.counts.lost == 0  # aof-everysec kept them
