"""Delayed jobs ([workload] delay_s) through each library's own delay API (real servers, real workers).

Each check reads the due times itself, from the timeline's enqueue times (the harness clock, taken
before the library computes its own due time) plus the delay, against the ledger's starts: never
crashbench's own early_starts or lateness, which it then checks against that reading.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from crashbench import jobids
from crashbench.errors import UsageError
from crashbench.evidence.checker import History, Sections
from crashbench.evidence.delays import delays
from crashbench.jobids import JobIds
from crashbench.model.executions import Execution, Executions
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Enqueue
from crashbench.run.session import Options, run_designs
from crashbench.scenario import problems_of
from tests.test_cli import crashbench_here
from tests.test_libraries import installed
from tests.test_worker_python import arq_python

DELAY_S = 1.0
# RQ scores a scheduled job in whole seconds (calendar.timegm of its due time: the fraction dropped), and
# its scheduler moves a job once the whole second of its score has begun: up to 1 s before it is due.
EARLY_BY_DESIGN = {"rq": 1.0}


def _starts_against_due(run: DesignRun, delay: float) -> tuple[list[float], set[str]]:
    """Each execution's start minus its job's due time (seconds), read off the timeline; the jobs started."""
    tl = run.timeline
    assert tl is not None
    due = {j: e.t + delay for e in tl.enqueues for j in e.ids}
    runs = Executions.of(tl.executions)
    offsets = [start - due[jobids.name(c)] for c, start in zip(runs.jobs, runs.starts, strict=True)]
    return offsets, {jobids.name(c) for c in runs.jobs}


def _delayed_run(small: Scenario, design: str, python: str | None = None) -> DesignRun:
    sc = small.replace(jobs=30, job_ms=10, workers=2, kills=0, delay_s=DELAY_S, drain_timeout=15)
    return run_designs(sc, [design], Options(worker_python=python)).runs[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "design",
    [pytest.param(d, marks=installed(d)) for d in ("celery", "rq", "dramatiq", "huey")] + ["arq", "saq"],
)
def test_each_library_starts_a_delayed_job_once_and_not_before_it_is_due(small: Scenario, design: str) -> None:
    python = arq_python() if design in ("arq", "saq") else None
    run = _delayed_run(small, design, python)
    c = run.counts
    assert run.problems == []
    assert c.done == c.enqueued == c.executions == 30  # each ran once: the delay made no second copy
    assert (c.lost, c.stranded, c.duplicated) == (0, 0, 0)
    offsets, started = _starts_against_due(run, DELAY_S)
    assert len(started) == 30
    # Not one start before its due time (a library that ignored the delay starts each job at once,
    # about DELAY_S early); RQ's scheduler by up to its whole-second rounding.
    allowed = EARLY_BY_DESIGN.get(design, 0.0)
    assert min(offsets) >= -allowed, sorted(offsets)[:3]
    assert c.early_starts == sum(1 for o in offsets if o < 0)  # crashbench's count, the same reading
    t = run.timings
    assert t.delay_lateness_ms_p50 is not None and t.delay_lateness_ms_max is not None
    assert t.delay_lateness_ms_max == pytest.approx(max(offsets) * 1000, abs=0.01)
    assert t.delay_lateness_ms_max < 5000  # each library's scheduler polls at least once a second


@pytest.mark.slow
@installed("celery")
def test_celery_runs_an_eta_task_again_every_visibility_timeout_with_acks_late(small: Scenario) -> None:
    # kombu#337, celery#2481: a countdown longer than the visibility timeout (celery:acks-late's is 1.02 s,
    # its restore sweep every second). The worker holds the ETA task unacked in Redis; the sweep restores
    # it every timeout, and each copy is taken and held again: every job runs two or more times. As
    # installed (visibility one hour, early ack) each runs once.
    sc = small.replace(jobs=10, job_ms=10, workers=2, kills=0, delay_s=4.0, drain_timeout=15)
    result = run_designs(sc, ["celery", "celery:acks-late"], Options())
    installed_run, late = result.runs
    assert installed_run.problems == [] and late.problems == []
    assert (installed_run.counts.done, installed_run.counts.duplicated, installed_run.counts.executions) == (10, 0, 10)
    assert late.counts.done == 10 and late.counts.duplicated == 10  # every one of them
    assert late.counts.extra_executions >= 10
    for run in (installed_run, late):
        offsets, _ = _starts_against_due(run, 4.0)
        assert min(offsets) >= 0 and run.counts.early_starts == 0  # each copy waited for its eta


def test_a_design_without_a_delay_is_refused_in_one_line(small: Scenario, tmp_path: Path) -> None:
    sc = small.replace(delay_s=1.0)
    for design, why in (("reliable", "no delay of its own"), ("taskiq", "schedule source")):
        with pytest.raises(UsageError, match=f"{design} cannot delay a job .*{why}"):
            run_designs(sc, [design], Options())
    done = crashbench_here("run", "--design", "stream", "--delay-s", "2", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[0].startswith("crashbench: error: stream cannot delay a job")


def test_delay_settings_are_validated_one_line_each(small: Scenario) -> None:
    bad = problems_of(small.replace(delay_s=-1.0, delay_share=1.5))
    assert "workload.delay_s must be a number >= 0, not -1.0" in bad
    assert "workload.delay_share must be a number between 0 and 1, not 1.5" in bad
    assert problems_of(small.replace(delay_s=90_000.0)) == [
        "workload.delay_s is 90000.0 s: a run's schedule is bounded to 86400 s (a day)"
    ]


def test_delay_share_delays_that_share_of_jobs_fixed_by_seed() -> None:
    sc = Scenario.of(jobs=1000, delay_s=2.0, delay_share=0.25)
    model = sc.workload_model()
    delays_of = [model.delay_of(j) for j in JobIds(range(1000))]
    assert set(delays_of) == {0.0, 2.0} and 200 < delays_of.count(2.0) < 300
    assert delays_of == [sc.workload_model().delay_of(j) for j in JobIds(range(1000))]
    assert {Scenario.of(delay_s=0.0).workload_model().delay_of(j) for j in JobIds(range(10))} == {0.0}


def test_the_checker_counts_early_starts_and_lateness_from_the_due_times() -> None:
    # Two jobs enqueued at -0.5 s (timeline clock) with a 1 s delay: due at 0.5 s. 000000 starts at
    # 0.3 s (early) and again at 0.9 s; 000001 starts at 0.75 s. A job not enqueued is no concern of it.
    sc = Scenario.of(jobs=2, delay_s=1.0)
    runs = Executions.of(
        [Execution("000000", "w1", 0.3, 0.31), Execution("000001", "w2", 0.75, 0.76),
         Execution("000000", "w2", 0.9, 0.91), Execution("000009", "w1", 0.0, 0.01)]
    )  # fmt: skip
    timeline = SimpleNamespace(enqueues=[Enqueue(-0.5, JobIds(range(2)))])
    section = delays(History(timeline, sc, runs), Sections())  # type: ignore[arg-type]
    assert section.counts == {"early_starts": 1}
    assert section.jobs == {"early_starts": ["000000"]}
    assert section.facts["lateness"] == [-200.0, 250.0]
    assert delays(History(timeline, Scenario.of(jobs=2), runs), Sections()).counts == {}  # type: ignore[arg-type]
