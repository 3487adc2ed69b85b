"""The checker protocol (crashbench.evidence.checker): composed checkers, each seeing the sections
before it; a checker that raises gives an unknown verdict with its error, the others still run, and
the run ends with that error (exit 5), on a real saved run's timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashbench.errors import ExitCode, UnexpectedError
from crashbench.evidence import tally
from crashbench.evidence.checker import History, Section, Sections, checker, compose, crashed, merged_counts
from crashbench.faults import registry
from crashbench.model.results import Result
from crashbench.model.timeline import Timeline
from crashbench.report import recount

ROOT = Path(__file__).resolve().parent.parent
SAVED = ROOT / "results" / "readme" / "20261203-064521-33bd600d-compare-default-naive-reliable-stream.json"


def saved_timeline() -> tuple[Timeline, Result]:
    result = Result.from_dict(json.loads(SAVED.read_text()))
    return recount.timelines_of(SAVED, result)[0], result


@checker("first")
def first(h: History, before: Sections) -> Section:
    return Section("first", counts={"lost": 7, "done": 1}, facts={"n": len(h.timeline.ids)})


@checker("second")
def second(h: History, before: Sections) -> Section:
    return Section("second", counts={"done": before.fact("first", "n")})


@checker("raises")
def raises(h: History, before: Sections) -> Section:
    raise ZeroDivisionError("a checker's bug")


@checker("needs_raises")
def needs_raises(h: History, before: Sections) -> Section:
    return Section("needs_raises", facts={"x": before.fact("raises", "x")})


def test_composed_checkers_run_in_order_each_seeing_the_ones_before() -> None:
    tl, _ = saved_timeline()
    sections = compose([first, second], History.of(tl))
    assert list(sections) == ["first", "second"] and crashed(sections) == []
    c = merged_counts(sections)
    assert (c.lost, c.done) == (7, len(tl.ids))  # the later section's done wins
    assert sections["first"].valid is True


def test_a_checker_that_raises_is_unknown_with_its_error_and_the_others_still_run() -> None:
    tl, _ = saved_timeline()
    sections = compose([raises, first, needs_raises, second], History.of(tl))
    assert [s.name for s in crashed(sections)] == ["raises", "needs_raises"]
    assert sections["raises"].valid is None and "ZeroDivisionError: a checker's bug" in (sections["raises"].error or "")
    assert "test_checker.py" in (sections["raises"].error or "")  # where it raised
    assert "checker raises has no x: it raised" in (sections["needs_raises"].error or "")
    assert sections["second"].counts == {"done": len(tl.ids)}  # unaffected


def test_a_run_whose_checker_raises_ends_with_exit_5_naming_it_never_with_counts() -> None:
    tl, _ = saved_timeline()
    with pytest.raises(UnexpectedError, match="checker raises raised, its verdict is unknown") as caught:
        tally.design_run(tl, checkers=[*registry.checkers(), raises])
    assert caught.value.exit_code == ExitCode.UNEXPECTED


def test_the_run_s_checkers_give_the_saved_run_s_counts_again() -> None:
    """The core checkers, then each fault family's (the broker's and the cluster's one shared checker
    once): the saved run's counts again."""
    tl, result = saved_timeline()
    again = tally.design_run(tl, registry.checkers())
    assert again.counts == result.runs[0].counts and again.problems == result.runs[0].problems
    assert [c.name for c in registry.checkers()] == [
        "signals", "evidence", "outcomes", "requeues", "trim", "recovery", "effects", "delays", "liveness", "broker",
        "deploy", "migrate", "eviction", "split_brain", "failover", "power", "hosts",
    ]  # fmt: skip
