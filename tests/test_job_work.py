"""workload.job_work: a handler that sleeps lets the process's other threads run (a library's heartbeat);
one that holds the GIL (job_work = "gil") does not, for its whole duration."""

from __future__ import annotations

import threading
import time

import pytest

from crashbench import scenario
from crashbench.errors import ScenarioError
from crashbench.model.spec import Scenario
from crashbench.model.workload import spend


def other_thread_in_the_middle(work: str, seconds: float = 1.0) -> int:
    """How often another thread of this process ran in the middle 60 % of a handler's `seconds` (each mark
    is a thousand of its steps). At the edges it may run while the handler waits for the GIL to start."""
    marks: list[float] = []
    stop, started = threading.Event(), threading.Event()

    def counter() -> None:
        started.set()
        steps = 0
        while not stop.is_set():
            steps += 1
            if steps % 1000 == 0:
                marks.append(time.monotonic())

    t = threading.Thread(target=counter)
    t.start()
    started.wait()
    begin = time.monotonic()
    spend(seconds, work)
    end = time.monotonic()
    stop.set()
    t.join()
    edge = 0.2 * (end - begin)
    return sum(begin + edge < m < end - edge for m in marks)


def test_a_job_that_holds_the_gil_starves_the_other_threads() -> None:
    # Asleep, the other thread runs all the while; holding the GIL, never in the middle of it, whatever the load.
    assert other_thread_in_the_middle("sleep") > 0
    assert other_thread_in_the_middle("gil") == 0


def test_job_work_is_a_choice_and_the_default_keeps_the_fingerprint() -> None:
    assert Scenario.of(job_work="sleep").fingerprint() == Scenario().fingerprint()
    assert Scenario.of(job_work="gil").fingerprint() != Scenario().fingerprint()
    assert Scenario.of(job_work="gil").workload_model().job_work == "gil"
    with pytest.raises(ScenarioError, match=r"workload\.job_work must be one of sleep, gil, not 'spin'"):
        scenario.with_overrides(Scenario(), job_work="spin")
