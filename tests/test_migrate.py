"""The migration from the list queue to the stream (crashbench/designs/migrating.py, crashbench/faults/migrate.py):
the design's routing on a real server, the harness's reading of the list side, the entry's checks, and the
migrate and migrate-early-stop scenarios' crash runs, whose expectations each fire on the other's run."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from crashbench import faults, scenario
from crashbench.designs.migrating import MigratingQueue, on_stream
from crashbench.errors import UsageError
from crashbench.evidence.checker import History, Section, Sections
from crashbench.faults.migrate import _migrate, events, list_side_empty
from crashbench.jobids import JobIds
from crashbench.model.executions import Execution, Executions
from crashbench.model.queue import SLOT_ENV, DesignSettings, Job, Located
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.thresholds import evaluate
from crashbench.model.timeline import FaultEvent
from crashbench.report import html
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, parse
from tests.conftest import assert_recounts
from tests.expectations import assert_each_can_fail, committed_runs

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "readme" / "list-to-stream"  # make list-to-stream: docs/findings/list-to-stream.md
SETTINGS = DesignSettings(stale_after=10.0, recover_every=1.0)


def _worker(client: redis.Redis, prefix: str, slot: int, monkeypatch: pytest.MonkeyPatch) -> MigratingQueue:
    monkeypatch.setenv(SLOT_ENV, str(slot))
    q = MigratingQueue(client, prefix, SETTINGS)
    monkeypatch.delenv(SLOT_ENV)
    return q


def test_the_flag_moves_the_producer_and_each_slot_takes_from_its_side(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = "test:mig1:"
    harness = MigratingQueue(client, prefix, SETTINGS)
    harness.setup()
    harness.enqueue([Job("a")])
    harness.flip()
    harness.enqueue([Job("b")])
    assert harness.state().held == {"a": "list:pending", "b": "stream:pending"}
    assert harness.backlog() == 2
    lister, streamer = _worker(client, prefix, 2, monkeypatch), _worker(client, prefix, 3, monkeypatch)
    assert not on_stream(2) and on_stream(3)
    for q, name, want in ((lister, "w1", "a"), (streamer, "w2", "b")):
        q.start_worker(name, 0.0)
        job = q.fetch(name, 0.01, 0.0)
        assert job is not None and job.id == want
    assert harness.state().held == {"a": "list:processing:w1", "b": "stream:pel:w2"}
    assert lister.fetch("w1", 0.01, 0.0) is None and streamer.fetch("w2", 0.01, 0.0) is None


def test_the_harness_reads_the_list_side_empty_only_when_it_is(client: redis.Redis) -> None:
    prefix = "test:mig2:"
    raw = redis.Redis(connection_pool=client.connection_pool)  # any client: the reading sums lengths
    q = MigratingQueue(client, prefix, SETTINGS)
    q.setup()
    assert list_side_empty(raw, prefix)
    q.enqueue([Job("a")])
    assert not list_side_empty(raw, prefix)  # pending
    q.lists.start_worker("w1", 0.0)
    job = q.lists.fetch("w1", 0.01, 0.0)
    assert job is not None and not list_side_empty(raw, prefix)  # a processing list
    q.lists.fail("w1", job, 0.0)
    assert client.zcard(prefix + "list:delayed") == 1 and not list_side_empty(raw, prefix)  # a delayed retry
    client.delete(prefix + "list:delayed")
    q.flip()
    q.enqueue([Job("b")])
    assert list_side_empty(raw, prefix)  # the stream's job is not the list's


def test_every_problem_of_a_migrate_entry_is_named() -> None:
    def problems(entry: dict[str, Any], **sections: Any) -> str:
        doc = {"faults": [{"kind": "migrate", **entry}], "workload": {"workers": 4, "produce": "during"}, **sections}
        with pytest.raises(ScenarioError) as caught:
            parse(doc, "x.toml")
        return str(caught.value)

    assert "migrate entry 1: at must be a number of seconds from 0, not -1" in problems({"at": -1})
    assert "migrate entry 1: stop_after must be a number of seconds from 0, not 'x'" in problems({"stop_after": "x"})
    assert "migrate needs the migrating design alone, not reliable" in problems({}, run={"designs": ["reliable"]})
    assert "migrate needs at least 2 workers" in problems({}, workload={"workers": 1, "produce": "during"})
    assert 'migrate needs workload.produce = "during"' in problems({}, workload={"workers": 2})
    assert "unknown key 'slot' for migrate" in problems({"slot": 1})
    assert "after_jobs must be a number of jobs from 0 to 2000, not 2001" in problems({"after_jobs": 2001})
    drained = {"faults": [{"kind": "migrate"}, {"slot": 1, "at": 0, "after": "drained", "kill_when": "any"}]}
    assert "a signal timed from the drain would find the list workers stopped" in problems({}, **drained)
    assert "migrate entry 1: stop_when must be empty or llen, not 'never'" in problems({"stop_when": "never"})
    assert "stop_after (a time) and stop_when (a reading) exclude each other" in problems(
        {"stop_when": "llen", "stop_after": 1}
    )
    ok = {"faults": [{"kind": "migrate", "at": 2, "stop_after": 0.5}], "workload": {"workers": 2, "produce": "during"}}
    (f,) = faults.plan(parse(ok, "x.toml"))
    assert (f.kind, f.at, f.stop_after, f.stop_when, f.after_jobs) == ("migrate", 2.0, 0.5, "empty", 0)


def test_a_migration_of_another_design_is_refused_before_its_flip(valkey_url: str) -> None:
    sc = scenario.load(str(ROOT / "scenarios" / "migrate-early-stop.toml"))
    with pytest.raises(UsageError, match="the migrate fault needs the migrating design, not reliable"):
        run_designs(sc, ["reliable"], Options(redis_url=valkey_url))


def _failing(sc: scenario.Scenario, run: DesignRun) -> list[str]:
    return [t.rule() for t in sc.expect["migrating"] if evaluate(t, "migrating", [run], None).status == "fail"]


def _run(name: str, url: str, tmp_path: Path) -> tuple[scenario.Scenario, DesignRun]:
    sc = scenario.load(str(ROOT / "scenarios" / f"{name}.toml"))
    result = run_designs(sc, ["migrating"], Options(redis_url=url))
    (run,) = result.runs
    assert run.problems == [] and run.timeline is not None
    assert_recounts(result, tmp_path)
    # The report draws the dual run across the lanes and a cross where each list worker was stopped.
    page = html.render(result, [run.timeline])
    assert page.count('<g class="band migrate">') == 1 and page.count("migrate: SIGTERM w") == 2
    assert ".band.migrate rect{" in page
    return sc, run


def _sides_are_kept(run: DesignRun) -> None:
    """The ledger's evidence for the flip's split: every execution of a job enqueued before it ran in a list
    worker (even slot), every other one in a stream worker, and the list workers stopped are the even slots'."""
    tl = run.timeline
    assert tl is not None
    (flip,) = events(tl, "flip")
    before = set(list(tl.ids)[: flip.data["to_list"]])
    slot = tl.slot_of()
    wrong = [ex.job for ex in tl.executions if (ex.job in before) == on_stream(slot[ex.worker])]
    assert wrong == [] and run.counts.enqueued_list == len(before) > 0
    assert run.counts.enqueued_list + run.counts.enqueued_stream == run.counts.enqueued
    assert all(not on_stream(e.data["slot"]) for e in events(tl, "sigterm"))


@pytest.mark.slow
def test_the_migrate_scenarios_meet_their_expectations(valkey_url: str, tmp_path: Path) -> None:
    full_sc, full = _run("migrate", valkey_url, tmp_path / "full")
    early_sc, early = _run("migrate-early-stop", valkey_url, tmp_path / "early")
    assert _failing(full_sc, full) == _failing(early_sc, early) == []
    for run in (full, early):
        _sides_are_kept(run)
    # The list drained before its workers stopped, and the stop came after the flip by that long.
    tl = full.timeline
    assert tl is not None
    (flip,), (drained,), (stop,) = events(tl, "flip"), events(tl, "drained"), events(tl, "stop")
    assert flip.t < drained.t <= stop.t and full.counts.list_drain_ms == round((drained.t - flip.t) * 1000)
    # Each scenario's expectations fire on the other's run: the flip's place (600 jobs against 400), the
    # early stop's stranded backlog, the list never seen empty; the full run strands nothing.
    assert _failing(full_sc, early) == [
        "enqueued_list == 600", "enqueued_stream == 900", "list_drained == 1", "list_drain_ms > 0",
        "done == enqueued", "stranded == 0",
    ]  # fmt: skip
    assert _failing(early_sc, full) == ["enqueued_list == 400", "list_drained == 0", "stranded > 0"]
    assert early.counts.stranded_list == early.counts.stranded > 0
    assert early.counts.stranded_at == {"list": early.counts.stranded}  # where the core's count puts them too
    assert_each_can_fail(full_sc, [full])
    assert_each_can_fail(early_sc, [early])


@pytest.mark.parametrize("name", ["migrate", "migrate-early-stop", "migrate-llen"])
def test_the_committed_runs_meet_their_scenario(name: str) -> None:
    """The findings' runs (make list-to-stream): each meets its scenario's expectations, each of which can fail."""
    sc = scenario.load(str(ROOT / "scenarios" / f"{name}.toml"))
    runs = committed_runs(OUT)[name]
    assert [r.seed for r in runs] == [1, 2, 3]
    assert [(r.seed, _failing(sc, r)) for r in runs] == [(r.seed, []) for r in runs]
    assert_each_can_fail(sc, runs)


@pytest.mark.slow
def test_llen_alone_strands_the_job_a_dead_list_worker_held(valkey_url: str, tmp_path: Path) -> None:
    """The guide's condition as written (LLEN jobs == 0) stops the list workers while each killed one's job
    waits for the reaper in its processing list: one job stranded on the list per kill. The default end
    condition, which reads the processing lists too, waits for them: nothing stranded."""
    sc, llen = _run("migrate-llen", valkey_url, tmp_path / "llen")
    assert _failing(sc, llen) == [] and llen.counts.stranded == llen.counts.kills == 2
    _sides_are_kept(llen)
    entries = tuple({k: v for k, v in e.items() if k != "stop_when"} for e in sc.faults.schedule)
    full = run_designs(sc.replace(schedule=entries), ["migrating"], Options(redis_url=valkey_url)).runs[0]
    assert full.problems == [] and (full.counts.stranded, full.counts.lost, full.counts.duplicated) == (0, 0, 0)
    assert full.counts.done == full.counts.enqueued and full.counts.list_drained == 1
    assert _failing(sc, full) == ["list_drained == 0", "stranded == kills_mid_job"]


def test_the_checker_splits_each_outcome_by_structure() -> None:
    # Six jobs, the first three enqueued before the flip (the list's). The outcomes checker's classes say
    # 000001 and 000004 lost, 000002 and 000005 stranded (000002 found on the list, 000005 in the stream's
    # PEL); the ledger has 000000 and 000003 completed twice. Every split count fires on its own job.
    flip = FaultEvent("migrate", "flip", 1.0, {"to_list": 3})
    tl = SimpleNamespace(
        fault_events=[flip, FaultEvent("migrate", "drained", 1.5, {"after_ms": 500}),
                      FaultEvent("migrate", "stop", 1.5, {}), FaultEvent("migrate", "sigterm", 1.5, {"slot": 0})],
        ids=JobIds(range(6)),
        located=Located(held={"000002": ["list:pending"], "000005": ["pel:w3"]}),
    )  # fmt: skip
    runs = Executions.of(
        [Execution("000000", "w0", 0.1, 0.2), Execution("000000", "w2", 0.3, 0.4), Execution("000003", "w1", 1.1, 1.2),
         Execution("000003", "w3", 1.3, 1.4), Execution("000001", "w0", 0.5)]
    )  # fmt: skip
    before = Sections(outcomes=Section("outcomes", facts={"classes": {"lost": {"000001", "000004"},
                                                                     "stranded": {"000002", "000005"}}}))  # fmt: skip
    counts = _migrate(History(tl, Scenario(), runs), before).counts  # type: ignore[arg-type]
    assert counts == {
        "migrations": 1, "enqueued_list": 3, "enqueued_stream": 3, "list_drained": 1, "list_drain_ms": 500,
        "list_workers_stopped": 1, "lost_list": 1, "lost_stream": 1, "stranded_list": 1, "stranded_stream": 1,
        "duplicated_list": 1, "duplicated_stream": 1,
    }  # fmt: skip
    # Without a flip (a run without the fault), the section sets nothing.
    tl.fault_events = []
    assert _migrate(History(tl, Scenario(), runs), before).counts == {}  # type: ignore[arg-type]


def test_a_migrate_entry_of_any_shape_is_a_scenario_error_never_a_traceback() -> None:
    weird: list[Any] = [None, [], {}, "x", -1, 1e20, True, [1], 10**30]
    workloads: list[dict[str, Any]] = [{"workers": 4, "produce": "during"}, {"workers": "x", "jobs": "y"}, {}]
    for key in ("at", "after_jobs", "stop_after", "stop_when"):
        for value in weird:
            for workload in workloads:
                for run in ({}, {"designs": "migrating"}, {"designs": [1]}):
                    doc = {"faults": [{"kind": "migrate", key: value}], "workload": workload, "run": run}
                    with contextlib.suppress(ScenarioError):  # anything else (a TypeError) fails the test
                        parse(doc, "x.toml")
