"""The deploy family (crashbench.faults.deploy): a rolling restart on real workers and a real server.
Every count is checked against the ledger on its own: the jobs open in each worker when its SIGKILL
came are exactly what naive loses; a worker that outlives no grace is never SIGKILLed; the replacement
starts at the SIGTERM (at-once) or after the old worker is gone (after-exit)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from crashbench import faults
from crashbench.faults.deploy import deploy_option
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline
from crashbench.report import html
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, parse
from tests.conftest import assert_recounts


def deployed(entry: dict[str, Any], **workload: Any) -> Scenario:
    sc = Scenario.of(name="deploy", kills=0, stale_after=1.0, recover_every=0.1, heartbeat_every=0.2,
                     drain_timeout=20, **workload)  # fmt: skip
    return sc.replace(schedule=({"kind": "deploy", **entry},))


def events(tl: Timeline, what: str) -> list[Any]:
    return [e for e in tl.fault_events if e.family == "deploy" and e.what == what]


def spawned(tl: Timeline) -> dict[str, float]:
    return {s.worker: s.t for s in tl.spawns}


def run_one(sc: Scenario, design: str, saved: Path | None = None) -> tuple[DesignRun, Timeline]:
    result = run_designs(sc, [design], Options())
    (run,) = result.runs
    assert run.timeline is not None and result.problems == []
    if saved is not None:  # its events saved with the timeline: every count again from them; its bands drawn
        assert_recounts(result, saved)
        page = html.render(result, [run.timeline])
        assert page.count('<g class="band deploy killed">') == 2 and ".band.deploy rect{" in page
    return run, run.timeline


def test_every_problem_of_a_deploy_entry_is_named() -> None:
    def problems(**entry: Any) -> str:
        with pytest.raises(ScenarioError) as caught:
            parse({"faults": [{"kind": "deploy", **entry}], "workload": {"workers": 3}}, "x.toml")
        return str(caught.value)

    assert "deploy entry 1: at must be a number of seconds from 0, not -1" in problems(at=-1)
    assert "deploy entry 1: grace must be a number of seconds from 0, not 'long'" in problems(grace="long")
    assert "deploy entry 1: pause must be a number of seconds from 0, not True" in problems(pause=True)
    assert "deploy entry 1: surge must be at-once or after-exit, not 'maybe'" in problems(surge="maybe")
    assert "deploy entry 1: target must be parent or tree, not 'child'" in problems(target="child")
    assert "slots must be a list of worker slots, 0 to 2, not [0, 3]" in problems(slots=[0, 3])
    assert "slots must be a list of worker slots, 0 to 2, not []" in problems(slots=[])
    assert "deploy entry 1: slots names a slot twice: [1, 1]" in problems(slots=[1, 1])
    assert "unknown key 'signal' for deploy (known: kind, at, grace, surge" in problems(signal="SIGKILL")
    every = problems(at=-1, surge="x", target="y", slots=[9])  # all of them, one line each
    assert every.startswith("x.toml: 4 problem(s)\n") and every.count("\n  - [[faults]] deploy entry 1: ") == 4
    sc = parse({"faults": [{"kind": "deploy", "grace": 2, "slots": [2, 0]}], "workload": {"workers": 3}}, "x.toml")
    (f,) = faults.plan(sc)
    assert (f.kind, f.slots, f.grace, f.surge, f.target, f.pause) == ("deploy", (2, 0), 2.0, "at-once", "parent", 0.0)
    assert deploy_option("30") == {"kind": "deploy", "grace": 30}
    assert deploy_option("2,surge=after-exit,slots=0+2") == {
        "kind": "deploy", "grace": 2, "surge": "after-exit", "slots": [0, 2],
    }  # fmt: skip
    with pytest.raises(ValueError, match="'grace' is not KEY=VALUE"):
        deploy_option("2,grace")


@pytest.mark.parametrize("design", ["naive", "reliable"])
def test_a_worker_still_in_its_job_at_the_grace_s_end_is_sigkilled_and_naive_loses_exactly_that_job(
    design: str, tmp_path: Path
) -> None:
    # 1.5-second jobs, SIGTERM 0.3 s in, a 0.5 s grace: each old worker is inside its first job when the
    # grace ends. Its replacement starts at the SIGTERM (at-once).
    sc = deployed({"at": 0.3, "grace": 0.5, "surge": "at-once"}, jobs=8, job_ms=1500, workers=2)
    run, tl = run_one(sc, design, tmp_path)
    c = run.counts
    terms, killed = events(tl, "sigterm"), events(tl, "killed")
    assert [e.data["slot"] for e in terms] == [0, 1] and not events(tl, "exited")
    assert [e.data["worker"] for e in killed] == [e.data["worker"] for e in terms]
    for term, kill in zip(terms, killed, strict=True):
        assert 0.5 <= kill.t - term.t < 1.0  # SIGKILL at the grace's end, on the loop's tick
        # The ledger alone: what the old worker started and never ended is what the SIGKILL hit.
        open_there = [ex.job for ex in tl.executions if ex.worker == term.data["worker"] and ex.end is None]
        assert open_there == kill.data["jobs"] and len(open_there) == 1
    # at-once: each replacement spawned at its SIGTERM, before the old worker was killed.
    for rep, term, kill in zip(events(tl, "replacement"), terms, killed, strict=True):
        assert rep.data["old"] == term.data["worker"] and term.t <= spawned(tl)[rep.data["worker"]] < kill.t
    hit = {j for e in killed for j in e.data["jobs"]}
    assert (c.rollouts, c.deploy_stops, c.deploy_graceful, c.deploy_killed) == (1, 2, 0, 2)
    assert c.deploy_interrupted == len(hit) == 2 and c.worker_crashes == 0
    if design == "naive":
        assert set(run.jobs["lost"]) == hit and c.lost == c.deploy_lost == 2 and c.done == 6
    else:
        assert c.lost == c.deploy_lost == 0 and c.done == 8 and c.redelivered == 2 and c.duplicated == 0


@pytest.mark.parametrize("design", ["naive", "reliable"])
def test_jobs_shorter_than_the_grace_end_in_it_and_after_exit_waits_for_the_old_worker(design: str) -> None:
    sc = deployed({"at": 0.3, "grace": 5, "surge": "after-exit"}, jobs=20, job_ms=300, workers=2)
    run, tl = run_one(sc, design)
    c = run.counts
    exited, terms = events(tl, "exited"), events(tl, "sigterm")
    assert not events(tl, "killed") and len(exited) == len(terms) == 2
    for term, out, rep in zip(terms, exited, events(tl, "replacement"), strict=True):
        assert out.data["worker"] == term.data["worker"] and out.data["jobs"] == [] and out.t - term.t < 1.0
        assert out.t <= spawned(tl)[rep.data["worker"]]  # after-exit: the replacement once the old one is gone
        assert all(ex.end is not None for ex in tl.executions if ex.worker == out.data["worker"])
    ready = events(tl, "ready")
    assert terms[1].t >= ready[0].t  # the next slot's turn once the first replacement is READY
    assert (c.rollouts, c.deploy_stops, c.deploy_graceful, c.deploy_killed, c.deploy_interrupted) == (1, 2, 2, 0, 0)
    assert c.lost == c.deploy_lost == 0 and c.done == 20 and c.interrupted == 0 and c.worker_crashes == 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("huey") is None, reason="huey is not installed")
def test_huey_under_a_deploy_is_observed_not_assumed() -> None:
    # What huey does with SIGTERM is huey's: the family only sees whether it exited within the grace and
    # what its ledger left open; every job it left open is one huey (RPOP, at-most-once) loses.
    sc = deployed({"at": 0.5, "grace": 5}, jobs=12, job_ms=1500, workers=2)
    run, tl = run_one(sc, "huey")
    c = run.counts
    ends = events(tl, "exited") + events(tl, "killed")
    assert c.deploy_stops == 2 and c.deploy_graceful + c.deploy_killed == 2 == len(ends)
    left_open = {j for e in ends for j in e.data["jobs"]}
    assert c.deploy_interrupted == len(left_open) and c.deploy_lost == len(left_open & set(run.jobs.get("lost", [])))
    assert c.deploy_lost <= c.lost and c.worker_crashes == 0
