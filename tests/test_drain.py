"""The drain's notion of progress, on a clock the test drives (pure unit tests: no server, no worker;
the runs in test_crash and the library tests drain for real)."""

from __future__ import annotations

from collections.abc import Callable

from crashbench.run.drain import BOUND, drain, watch


class Clock:
    """Advanced by every tick of the drain's loop, 0.01 s at a time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now = round(self.now + 0.01, 6)


def run(backlog: Callable[[float], int], window: float, started: Callable[[float], int] = lambda t: 0) -> tuple:
    clock = Clock()
    ended = drain(
        clock.tick, clock, lambda: started(clock.now), lambda: False, lambda: backlog(clock.now),
        faults_end=0.0, window=window, settle=0.1, period=0.0,
    )  # fmt: skip
    return ended.drained, ended.cut_off, clock.now


def test_a_recovery_that_takes_jobs_one_by_one_without_running_them_is_waited_for() -> None:
    """saq as installed: its sweep aborts a dead worker's jobs 5 s apart, and runs none of them. The
    window (20 s) is shorter than the whole sweep (30 jobs, 150 s); each step is progress (within the
    bound of 10 windows)."""
    drained, cut_off, at = run(lambda t: max(0, 30 - int(t // 5)), window=20.0)
    assert (drained, cut_off) == (True, False) and 150 <= at < 151


def test_a_backlog_that_never_moves_ends_the_drain_after_one_window() -> None:
    drained, cut_off, at = run(lambda t: 7, window=6.0)
    assert (drained, cut_off) == (False, False) and 6.0 <= at < 6.1


def test_a_backlog_that_keeps_moving_is_cut_off_at_the_bound() -> None:
    drained, cut_off, at = run(lambda t: 5 + int(t) % 2, window=2.0)
    assert (drained, cut_off) == (False, True) and BOUND * 2.0 <= at < BOUND * 2.0 + 0.1


def test_a_backlog_the_server_cannot_tell_is_no_progress() -> None:
    """-1 (the server down) between two equal readings is not a change."""
    drained, _, at = run(lambda t: -1 if int(t * 10) % 2 else 4, window=3.0)
    assert not drained and 3.0 <= at < 3.1


def test_handler_starts_are_progress_too() -> None:
    drained, _, at = run(lambda t: 3 if t < 20 else 0, window=3.0, started=lambda t: int(t))
    assert drained and 20 <= at < 20.2


def test_the_watch_after_the_drain_keeps_the_most_backlog_it_read() -> None:
    clock = Clock()
    most = watch(clock.tick, clock, lambda: 2 if 0.05 < clock.now < 0.1 else 0, until=0.2, period=0.0)
    assert most == 2 and clock.now >= 0.2


def test_a_harness_that_stalls_while_the_queue_works_does_not_take_its_pause_for_the_queue_s_quiet() -> None:
    """The harness's loop stalls for 5 s (a loaded machine) in a window of 2 s while the workers went on
    starting handlers: progress is read before the deadline, so the drain goes on and sees the end."""

    class Stalling(Clock):
        def tick(self) -> None:
            self.now = round(self.now + (5.0 if self.now == 1.0 else 0.01), 6)

    clock = Stalling()
    ended = drain(
        clock.tick, clock, lambda: int(clock.now), lambda: False, lambda: 3 if clock.now < 7 else 0,
        faults_end=0.0, window=2.0, settle=0.1, period=0.0,
    )  # fmt: skip
    assert (ended.drained, ended.cut_off) == (True, False) and 7 <= clock.now < 7.2
