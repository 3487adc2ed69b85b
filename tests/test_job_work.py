"""workload.job_work: a handler that sleeps lets the process's other threads run (a library's heartbeat);
one that holds the GIL (job_work = "gil") does not, for its whole duration."""

from __future__ import annotations

import threading

import pytest

from crashbench import scenario
from crashbench.errors import ScenarioError
from crashbench.model.spec import Scenario
from crashbench.model.workload import spend


def other_thread_progress(work: str) -> int:
    """How many times another thread of this process counted while a handler spent 0.3 s."""
    count, stop, started = [0], threading.Event(), threading.Event()

    def counter() -> None:
        started.set()
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=counter)
    t.start()
    started.wait()
    before = count[0]
    spend(0.3, work)
    during = count[0] - before
    stop.set()
    t.join()
    return during


def test_a_job_that_holds_the_gil_starves_the_other_threads() -> None:
    asleep, holding = other_thread_progress("sleep"), other_thread_progress("gil")
    # Asleep, the other thread counts all the while; holding the GIL, at most a switch interval or two.
    assert asleep > 1000 and holding * 20 < asleep, (asleep, holding)


def test_job_work_is_a_choice_and_the_default_keeps_the_fingerprint() -> None:
    assert Scenario.of(job_work="sleep").fingerprint() == Scenario().fingerprint()
    assert Scenario.of(job_work="gil").fingerprint() != Scenario().fingerprint()
    assert Scenario.of(job_work="gil").workload_model().job_work == "gil"
    with pytest.raises(ScenarioError, match=r"workload\.job_work must be one of sleep, gil, not 'spin'"):
        scenario.with_overrides(Scenario(), job_work="spin")
