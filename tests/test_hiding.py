"""No place for a job to hide (crashbench.evidence.keyspace): jobs a design puts where its own reading
does not look are found by the harness's search for the run's token, counted stranded where they sit
(not lost), and a problem names how the design's reading missed them. Real servers, real workers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import assert_recounts

from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs

ASIDE = 60  # of 600 jobs, n % 10 == 3


def problems(run) -> dict[str, str]:  # type: ignore[no-untyped-def]
    if run.workdir:
        shutil.rmtree(run.workdir, ignore_errors=True)
    return {p.check: p.message for p in run.problems}


@pytest.mark.slow
@pytest.mark.parametrize(
    "design, check, place",
    [
        ("OmittedPattern", "undeclared_key", "stash"),
        ("BookkeepingStash", "bookkeeping_holds_jobs", "stash"),
        ("RelativeRewrite", "bookkeeping_holds_jobs", "stash"),
        ("OutsideNamespace", "outside_namespace", "elsewhere"),
        ("HashFieldName", "job_of_disagrees", "byid"),
        ("PrefixedMember", "job_of_disagrees", "later"),
        ("Base64Stash", "job_of_disagrees", "b64"),
        ("MapsToDone", "job_of_disagrees", "stash"),
    ],
)
def test_a_job_put_where_the_design_does_not_look_is_stranded_there_and_named(
    valkey_url: str, small: Scenario, design: str, check: str, place: str
) -> None:
    run = run_designs(small, [f"designs_hiding:{design}"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert (c.lost, c.stranded, c.done) == (0, ASIDE, 600 - ASIDE)
    assert sorted(run.jobs["stranded"]) == [f"{n:06d}" for n in range(600) if n % 10 == 3]
    assert [where for where in c.stranded_at if where.startswith(place)], c.stranded_at
    found = problems(run)
    assert check in found, found
    assert place in found[check] or check == "job_of_disagrees", found[check]  # the problem names the key


@pytest.mark.slow
def test_a_key_in_another_database_of_a_server_crashbench_started_is_read_and_named(
    small: Scenario, tmp_path: Path
) -> None:
    result = run_designs(small, ["designs_hiding:OtherDatabase"], Options())
    assert_recounts(result, tmp_path)  # the timeline keeps the search's findings: recount gives them again
    run = result.runs[0]
    c = run.counts
    assert (c.lost, c.stranded) == (0, ASIDE)
    found = problems(run)
    assert "outside_namespace" in found and "db3/" in found["outside_namespace"], found


@pytest.mark.slow
def test_honest_designs_raise_no_reading_problem_under_kills(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kills=3)
    designs = ["reliable", "stream", "reliable-batch", "priority", "stream-reuse", "sharded"]
    result = run_designs(sc, designs, Options(redis_url=valkey_url))
    for run in result.runs:
        assert problems(run) == {}, (run.design, run.problems)
        assert run.counts.lost == 0 and run.counts.stranded == 0
