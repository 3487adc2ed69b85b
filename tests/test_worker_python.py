"""Workers under another interpreter (--worker-python), and arq, which needs one (real server, real SIGKILL)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from crashbench.errors import UsageError
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from tests.conftest import assert_recounts

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def arq_python() -> str:
    """The interpreter with arq that `make test` creates (.venv/arq); the arq tests need it."""
    # Absolute (not resolved: a venv's python is a link), for tests that run from another directory.
    path = os.path.abspath(os.environ.get("CRASHBENCH_ARQ_PYTHON") or str(ROOT / ".venv" / "arq" / "bin" / "python"))
    if not Path(path).exists():
        pytest.skip(f"no interpreter with arq at {path} (make test creates it)")
    return path


def test_built_in_design_under_another_interpreter_loses_nothing_to_kills(small: Scenario) -> None:
    # Each worker execs a fresh interpreter: still a real process of ours, killed mid-job for real.
    # 600 jobs of 20 ms (3 s for 4 workers): work left after a loaded machine's cold start-ups.
    sc = small.replace(jobs=600, job_ms=20, kills=3, interval=0.3)
    run = run_designs(sc, ["reliable"], Options(worker_python=sys.executable)).runs[0]
    c = run.counts
    assert run.problems == []
    assert c.kills == 3 and c.kills_mid_job >= 1
    assert (c.lost, c.stranded) == (0, 0)
    assert c.done == c.enqueued == 600
    # A cold interpreter, not a fork: its start-up shows it.
    assert run.timings.startup_ms_median > 10


def test_an_interpreter_that_cannot_run_a_worker_is_a_usage_error(small: Scenario, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot run"):
        run_designs(small, ["reliable"], Options(worker_python=str(tmp_path / "no-python")))


@pytest.mark.parametrize("program", ["/bin/true", "/bin/false"])
def test_a_program_that_is_not_python_exits_2_as_documented(program: str) -> None:
    """/bin/true answers the version check with nothing, and exit 0: it was taken for a Python that
    has nothing, and every worker then "exited on their own" (exit 4)."""
    from click.testing import CliRunner

    from crashbench.cli import cli
    from crashbench.errors import ExitCode

    got = CliRunner().invoke(cli, ["run", "-d", "reliable", "--jobs", "5", "--worker-python", program, "--plain"])
    assert got.exit_code == ExitCode.USAGE, got.output
    assert f"--worker-python {program}" in got.output and "Traceback" not in got.output


@pytest.mark.skipif(importlib.util.find_spec("arq") is not None, reason="arq is installed here")
def test_arq_without_an_interpreter_that_has_it_names_the_option(small: Scenario) -> None:
    with pytest.raises(UsageError) as err:
        run_designs(small, ["arq"], Options())
    assert "--worker-python" in (err.value.hint or "")


@pytest.mark.parametrize("design", ["arq", "arq:reliable"])
def test_arq_without_kills_runs_every_job_exactly_once(small: Scenario, design: str) -> None:
    sc = small.replace(jobs=60, kills=0, library={design: {"poll_delay": 0.02}})
    result = run_designs(sc, [design], Options(worker_python=arq_python()))
    run = result.runs[0]
    c = run.counts
    assert run.problems == []
    assert c.done == c.enqueued == c.executions == 60
    # The versions that shaped the figures are those of the worker interpreter.
    assert result.environment.worker_python == arq_python() and "arq" in result.environment.libraries
    assert (c.lost, c.duplicated, c.stranded, c.failed) == (0, 0, 0, 0)


def test_arq_reliable_runs_a_killed_job_again_once_its_in_progress_key_expires(small: Scenario, tmp_path: Path) -> None:
    # arq keeps a started job's in-progress key job_timeout + 10 s (stale_after 0.3 s here); only then
    # does a worker start the job again. Nothing is lost; the recovery time shows arq's fixed 10 s.
    # One job at a time: with arq's max_jobs 10 the kill may also take a job whose handler ended before
    # arq removed it from the queue, which then runs again (at-least-once, not this test's point).
    sc = small.replace(
        jobs=150, job_ms=20, kills=1, interval=0.3, concurrency=1, library={"arq:reliable": {"poll_delay": 0.02}}
    )
    result = run_designs(sc, ["arq:reliable"], Options(worker_python=arq_python()))
    assert_recounts(result, tmp_path)  # workers under another interpreter, from the timeline alone
    run = result.runs[0]
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == 1, run.kills
    assert (c.lost, c.stranded, c.failed, c.duplicated) == (0, 0, 0, 0)
    assert c.done == c.enqueued == 150
    recovered = run.kills[0].recovered_after_ms
    assert recovered is not None and 10_000 <= recovered < 10_000 + 5_000


def test_arq_cancelling_a_job_its_handler_finishes_is_a_library_disagreement(small: Scenario) -> None:
    # job_timeout is a hard limit in arq: at 0.5 s it cancels the 1 s jobs and records each failed
    # (TimeoutError), while the handler's thread runs on and writes its end record. The run warns of
    # it before it starts, and counts every job as a disagreement, ids included.
    sc = small.replace(jobs=3, job_ms=1000, kills=0, library={"arq:reliable": {"job_timeout": 0.5, "max_tries": 1}})
    run = run_designs(sc, ["arq:reliable"], Options(worker_python=arq_python())).runs[0]
    c = run.counts
    assert run.problems == []
    assert any("job_timeout 0.5 s is not above the longest job" in w for w in run.warnings)
    assert c.done == c.executions == 3
    assert c.library_disagrees == 3 and run.jobs["library_disagrees"] == sorted(run.jobs["library_disagrees"])
    assert len(run.jobs["library_disagrees"]) == 3


def test_an_interpreter_per_library_runs_only_that_library_s_workers(small: Scenario) -> None:
    """--worker-python arq=PATH: arq's workers under PATH (arq is not importable here), the built-in
    design's in crashbench's own environment, both in one compare on one fault schedule."""
    sc = small.replace(jobs=60, kills=1, library={"arq:reliable": {"poll_delay": 0.02}})
    python = arq_python()
    result = run_designs(sc, ["reliable", "arq:reliable"], Options(library_pythons=(("arq", python),)))
    assert [r.design for r in result.runs] == ["reliable", "arq:reliable"]
    assert all(r.problems == [] and r.counts.done == r.counts.enqueued == 60 for r in result.runs)
    env = result.environment
    assert env.worker_python is None and env.library_pythons == {"arq": python}
    # Only arq's version comes from that interpreter: not its Python's nor its redis-py's.
    assert set(env.libraries) == {"arq"} and env.redis_py != env.libraries.get("redis")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["/usr/bin/python3"], ("/usr/bin/python3", ())),
        (["arq=/a/python", "saq=/b/python"], (None, (("arq", "/a/python"), ("saq", "/b/python")))),
        (["/opt/x=y/python", "arq=/a/python"], ("/opt/x=y/python", (("arq", "/a/python"),))),  # a path with =
        ([], (None, ())),
    ],
)
def test_worker_python_values_read_as_one_interpreter_and_one_per_library(values: list[str], expected: object) -> None:
    from crashbench.cli.common import worker_python_option

    assert worker_python_option(values) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["/a/python", "/b/python"], "given twice"),
        (["arq=/a/python", "arq=/b/python"], "arq=... given twice"),
        (["bull=/a/python"], "'bull' is not a queue library"),
    ],
)
def test_worker_python_values_that_cannot_be_meant_are_usage_errors(values: list[str], message: str) -> None:
    from crashbench.cli.common import worker_python_option

    with pytest.raises(UsageError, match=message):
        worker_python_option(values)
