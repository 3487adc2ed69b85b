"""The pytest plugin (crashbench.pytest_plugin), as a user meets it: test files of their own, run by a
pytest of their own (pytester, in a subprocess: real servers, real workers, real signals), with the
plugin loaded through its pytest11 entry point as an install registers it (tests/test_install.py does
the same from a wheel)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from crashbench.control import zygote
from tests.test_hygiene import name_of, tagged, wait_until_gone

pytest_plugins = ["pytester"]

# Small: 2 mid-job SIGKILLs at 0.1 s intervals into 0.75 s of work (4 workers x 300 jobs of 10 ms), so
# that every kill lands inside a handler even on a loaded machine; recovery after 0.3 s of silence.
SMALL = "jobs=300, kills=2, interval=0.1, stale_after=0.3, recover_every=0.05"
BASE = ["-p", "no:cacheprovider", "--strict-markers"]


def test_a_reliable_run_is_valid_and_its_result_and_report_are_saved(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        def test_reliable(crashbench):
            result = crashbench.run(design="reliable", {SMALL})
            result.assert_valid()
            assert result.counts.enqueued == 300 and result.counts.lost == 0
            assert result.total_queue.valid and result.status == "pass"
            assert [t.status for t in result.check("lost == 0", "done == enqueued")] == ["pass", "pass"]
            assert result.check()  # the scenario's [expect.reliable], as crashbench check evaluates it
            assert result.report.read_text().startswith("<!DOCTYPE html>")
            assert result.path.parent == result.report.parent and result.path.suffix == ".json"
            assert crashbench.results == [result]
        """
    )
    run = pytester.runpytest_subprocess(*BASE)
    run.assert_outcomes(passed=1)


def test_assert_valid_fails_on_naive_with_the_lost_count_the_ids_and_the_report(pytester: pytest.Pytester) -> None:
    """The naive queue loses the job a mid-job SIGKILL interrupts, one per kill (the default scenario's
    [expect.naive] holds that exactly): assert_valid says so, and where the report is."""
    pytester.makepyfile(
        f"""
        def test_naive(crashbench):
            crashbench.run(design="naive", {SMALL}).assert_valid()
        """
    )
    run = pytester.runpytest_subprocess(*BASE)
    run.assert_outcomes(failed=1)
    out = run.stdout.str()
    assert "naive: not a valid total queue: lost 2, unexpected 0, duplicated 0 of 300 enqueued" in out
    assert re.search(r"lost jobs: \d{6}, \d{6}\n", out), out
    report = Path(re.findall(r"report: (\S+\.html)$", out, flags=re.M)[0])
    assert report.is_file() and report.is_relative_to(pytester.path)
    assert report.with_suffix(".json").is_file()


def test_the_marker_sets_the_defaults_and_bad_input_fails_in_one_line(pytester: pytest.Pytester) -> None:
    """A module's marker, then the test's (the closest wins), then run()'s own arguments; a misspelt
    setting or an unknown scenario is a failure of one line and its hint, never a traceback."""
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.crashbench(jobs=100, kills=2)

        @pytest.mark.crashbench("naive", kills=1, interval=0.1)
        def test_marked(crashbench):
            result = crashbench.run(kills=0)
            assert result.runs[0].design == "naive"
            assert (result.counts.enqueued, result.counts.kills) == (100, 0)

        def test_misspelt(crashbench):
            crashbench.run(jbos=10)

        @pytest.mark.crashbench(scenario="no-such-scenario")
        def test_unknown_scenario(crashbench):
            crashbench.run()
        """
    )
    run = pytester.runpytest_subprocess(*BASE)
    run.assert_outcomes(passed=1, failed=2)
    out = run.stdout.str()
    assert "crashbench: unknown setting 'jbos': did you mean 'jobs'?\nhint: " in out
    assert "crashbench: " in out and "no-such-scenario" in out
    assert "Traceback" not in out and "pytest_plugin.py" not in out


def test_under_xdist_each_worker_runs_its_own(pytester: pytest.Pytester) -> None:
    """Two test processes (pytest -n 2), a crash run in each, at the same time: each on its own server."""
    seen = pytester.path / "seen"
    seen.mkdir()
    pytester.makepyfile(
        f"""
        import os, pathlib, pytest

        @pytest.mark.parametrize("design", ["reliable", "stream"])
        def test_run(crashbench, design):
            result = crashbench.run(design=design, {SMALL})
            result.assert_valid()
            worker = os.environ["PYTEST_XDIST_WORKER"]
            pathlib.Path({str(seen)!r}, worker).write_text(result.result.environment.server_url or "")
        """
    )
    run = pytester.runpytest_subprocess(*BASE, "-n", "2")
    run.assert_outcomes(passed=2)
    assert sorted(p.name for p in seen.iterdir()) == ["gw0", "gw1"]


def test_interrupting_a_test_stops_every_process_of_its_run(pytester: pytest.Pytester) -> None:
    """Ctrl-C while a test's crash run works: the run stops, every process it started with it, and
    pytest ends as interrupted (exit 2)."""
    pytester.makepyfile(
        """
        def test_long(crashbench):
            crashbench.run(design="reliable", jobs=20000, kills=0)
        """
    )
    tag = uuid.uuid4().hex
    args = [sys.executable, "-m", "pytest", *BASE, "--basetemp", str(pytester.path / "tmp")]
    env = {**os.environ, "CRASHBENCH_TEST_TAG": tag}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    proc = subprocess.Popen(args, cwd=pytester.path, env=env, **pipes)
    try:
        family: set[psutil.Process] = set()
        deadline = time.monotonic() + 30
        while not any(name_of(p) == zygote.NAME for p in family):  # its workers come from the fork server
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the crash run never got going"
            time.sleep(0.05)
            family = set(psutil.Process(proc.pid).children(recursive=True)) | tagged(tag)
        assert any(name_of(p).endswith("-server") for p in family)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out
    assert wait_until_gone(tag, family) == []
