"""Queue libraries under the same faults, running their own workers (real server, real SIGKILL)."""

from __future__ import annotations

import dataclasses

import pytest

from crashbench.errors import UsageError
from crashbench.scenario import Scenario
from crashbench.session import Options, run_designs

pytest.importorskip("rq")


@pytest.mark.parametrize("design", ["rq", "rq:reliable"])
def test_rq_without_kills_runs_every_job_exactly_once(small: Scenario, design: str) -> None:
    sc = dataclasses.replace(small, jobs=60, kills=0)
    run = run_designs(sc, [design], Options()).runs[0]
    c = run.counts
    assert run.count_problems == []
    assert c.done == c.enqueued == c.executions == 60
    assert (c.lost, c.duplicated, c.stranded, c.failed) == (0, 0, 0, 0)


def test_rq_leaves_a_killed_job_in_its_started_registry(small: Scenario) -> None:
    # What RQ 2.x does as installed: the work horse dies with the job, the job stays in rq:wip until
    # its heartbeat expires (>= 60 s) and a maintenance pass finds it. Within a 5 s window: stranded.
    # RQ runs ~70 jobs/s here and its workers take a moment to start: 200 jobs keep every kill mid-job.
    sc = dataclasses.replace(small, jobs=200, job_ms=5, kills=3, interval=0.15, drain_timeout=5)
    run = run_designs(sc, ["rq"], Options()).runs[0]
    c = run.counts
    assert run.count_problems == []
    assert c.kills_mid_job == 3, run.kills
    assert c.stranded == 3 and c.stranded_at == {"started": 3}
    assert set(run.jobs["stranded"]) == {k.job for k in run.kills}
    assert (c.lost, c.duplicated, c.failed) == (0, 0, 0)
    assert c.done == c.enqueued - 3
    assert not run.timings.drained  # the window ran out with the jobs still held


def test_library_designs_refuse_a_server_crashbench_does_not_own(valkey_url: str, small: Scenario) -> None:
    with pytest.raises(UsageError, match="outside crashbench's namespace"):
        run_designs(small, ["rq"], Options(redis_url=valkey_url))
