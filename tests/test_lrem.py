"""LREM by value with identical payloads (crashbench/designs/reliable_noid.py): the mechanics on a real
server with the clock passed in, and the lrem-identical scenario's crash runs, whose expectations each
fire on the other design's run."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from crashbench import scenario
from crashbench.designs.reliable_noid import ReliableIds, ReliableNoId, payload_of
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.results import DesignRun
from crashbench.model.thresholds import evaluate
from crashbench.report import store
from crashbench.run.session import Options, run_designs
from tests.conftest import assert_recounts
from tests.expectations import assert_each_can_fail

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "readme" / "list-to-stream"  # make list-to-stream: docs/findings/list-to-stream.md
PREFETCH = DesignSettings(stale_after=10.0, recover_every=1.0, batch_size=2)


def _two_in_one_list(q: ReliableIds, first: str, second: str) -> Job:
    """`first` and `second` enqueued in that order and both taken by w1: it runs `first` (the oldest)."""
    q.enqueue([Job(first), Job(second)])
    q.start_worker("w1", 0.0)
    job = q.fetch("w1", 0.01, 0.0)
    assert job is not None and job.id == first
    assert q.state().held == {first: "processing:w1", second: "processing:w1"}
    return job


def test_payloads_repeat_by_job_number() -> None:
    assert payload_of("000000") == payload_of("000002") == "report-0" != payload_of("000001")


def test_without_ids_the_ack_removes_the_copy_of_the_job_taken_ahead(client: redis.Redis) -> None:
    q = ReliableNoId(client, "test:noid1:", PREFETCH)
    job = _two_in_one_list(q, "000000", "000002")  # one payload, report-0
    assert q.ack("w1", job, 1.0) is True
    # The ack removed 000002's copy (the first match from the head): 000000, done, is still held ...
    assert q.state().held == {"000000": "processing:w1"}
    again = q.fetch("w1", 0.01, 1.0)
    assert again is not None and again.id == "000000"  # ... and runs again; 000002 never will
    assert q.ack("w1", again, 2.0) is True and q.backlog() == 0


def test_with_ids_the_ack_removes_the_job_it_acknowledges(client: redis.Redis) -> None:
    q = ReliableIds(client, "test:ids1:", PREFETCH)
    job = _two_in_one_list(q, "000000", "000002")
    assert q.ack("w1", job, 1.0) is True
    assert q.state().held == {"000002": "processing:w1"}
    nxt = q.fetch("w1", 0.01, 1.0)
    assert nxt is not None and nxt.id == "000002"


def test_without_ids_distinct_payloads_or_one_job_per_list_are_told_apart(client: redis.Redis) -> None:
    q = ReliableNoId(client, "test:noid2:", PREFETCH)
    job = _two_in_one_list(q, "000000", "000001")  # report-0 and report-1: the ack finds the right one
    q.ack("w1", job, 1.0)
    assert q.state().held == {"000001": "processing:w1"}
    # The guide's own pattern, one job per list: the ack finds only the job the worker ran.
    one = ReliableNoId(client, "test:noid3:", DesignSettings(stale_after=10.0, batch_size=1))
    one.enqueue([Job("000000"), Job("000002")])
    one.start_worker("w1", 0.0)
    first = one.fetch("w1", 0.01, 0.0)
    assert first is not None and first.id == "000000" and one.state().held["000002"] == "pending"
    one.ack("w1", first, 1.0)
    second = one.fetch("w1", 0.01, 1.0)
    assert second is not None and second.id == "000002"


def _failing(rules: scenario.Scenario, design: str, run: DesignRun) -> list[str]:
    return [t.rule() for t in rules.expect[design] if evaluate(t, design, [run], None).status == "fail"]


@pytest.mark.slow
def test_the_lrem_identical_scenario_meets_its_expectations(valkey_url: str, tmp_path: Path) -> None:
    sc = scenario.load(str(ROOT / "scenarios" / "lrem-identical.toml"))
    result = run_designs(sc, ["reliable-ids", "reliable-noid"], Options(redis_url=valkey_url), kind="compare")
    ids, noid = result.runs
    assert ids.problems == [] and noid.problems == []
    assert _failing(sc, "reliable-ids", ids) == _failing(sc, "reliable-noid", noid) == []
    # Each expectation fires on the other design's run: the ids' exactness on the losses and the
    # duplicates the bare ack makes, and the losses on a run that had none.
    assert _failing(sc, "reliable-ids", noid) == [
        "done == enqueued",
        "lost == 0",
        "duplicated == 0",
        "redeliveries == kills_mid_job",
    ]
    assert _failing(sc, "reliable-noid", ids) == ["lost > 0"]
    assert noid.counts.duplicated > 0 and noid.counts.done + noid.counts.lost == noid.counts.enqueued
    assert_each_can_fail(sc, result.runs)
    assert_recounts(result, tmp_path)


@pytest.mark.slow
def test_with_one_job_per_list_identical_payloads_cost_nothing(valkey_url: str) -> None:
    # The guide's pattern (batch_size 1): without ids, the same as with them under the same kills.
    sc = scenario.load(str(ROOT / "scenarios" / "lrem-identical.toml")).replace(batch_size=1)
    ids, noid = run_designs(sc, ["reliable-ids", "reliable-noid"], Options(redis_url=valkey_url)).runs
    for run in (ids, noid):
        assert run.problems == [] and _failing(sc, "reliable-ids", run) == []
    assert _failing(sc, "reliable-noid", noid) == ["lost > 0"]


def test_the_committed_runs_are_the_findings_table() -> None:
    """The findings' runs (make list-to-stream): with two jobs per list each design meets its own
    expectations and each expectation can fail; with one, reliable-noid meets reliable-ids' and not its own."""
    sc = scenario.load(str(ROOT / "scenarios" / "lrem-identical.toml"))
    by_batch: dict[int, list[DesignRun]] = {}
    for path in sorted(OUT.glob("*-lrem-identical-*.json")):
        result = store.load(str(path))
        assert result.scenario["name"] == "lrem-identical"
        by_batch.setdefault(int(result.scenario["batch_size"]), []).extend(result.runs)
    prefetch, one = by_batch.pop(2), by_batch.pop(1)
    assert by_batch == {}
    assert (
        sorted(r.design for r in prefetch)
        == sorted(r.design for r in one)
        == ["reliable-ids"] * 3 + ["reliable-noid"] * 3
    )
    assert [(r.design, _failing(sc, r.design, r)) for r in prefetch if _failing(sc, r.design, r)] == []
    assert_each_can_fail(sc, prefetch)
    assert [_failing(sc, "reliable-ids", r) for r in one] == [[]] * 6
    assert [_failing(sc, "reliable-noid", r) for r in one if r.design == "reliable-noid"] == [["lost > 0"]] * 3
