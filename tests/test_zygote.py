"""The fork server (crashbench.control.zygote): the workers it forks are the runner's own children, it
and they leave out what the runner allocated after it started, and it ends when it should.
(That nothing of it outlives crashbench, killed or interrupted: tests/test_hygiene.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from crashbench.control.supervisor import Supervisor, WorkerProcess
from crashbench.control.zygote import NAME, Zygote
from crashbench.model.spec import Scenario
from crashbench.run import runner
from crashbench.run.session import Options, run_designs

BALLAST = 128 << 20  # bytes the runner holds from after the zygote started on: a large job list


def supervisor(tmp_path: Path) -> Supervisor:
    """Workers that say they run, then idle until stop_all's SIGTERM."""

    def prepare(name: str, slot: int) -> Callable[[], int]:
        def body() -> int:
            (tmp_path / f"{name}.runs").touch()
            time.sleep(60)
            return 0

        return body

    sup = Supervisor(prepare, tmp_path, time.monotonic)
    sup.start_zygote()
    assert sup.zygote is not None
    return sup


def running(w: WorkerProcess) -> psutil.Process:
    """The worker once its body runs."""
    deadline = time.monotonic() + 5
    while not (w.log.parent / f"{w.name}.runs").exists():
        assert time.monotonic() < deadline, f"{w.name}: {w.log.read_text() if w.log.exists() else 'no log'}"
        time.sleep(0.001)
    return psutil.Process(w.pid)


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def test_a_worker_the_zygote_forks_is_the_runner_s_child_to_reap_kill_and_replace(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    assert sup.zygote is not None
    zygote = psutil.Process(sup.zygote.pid)
    try:
        assert zygote.name() == NAME
        w = sup.spawn(0)
        assert os.waitpid(w.pid, os.WNOHANG) == (0, 0)  # ours to wait for as soon as spawn returns
        assert sup.zygote is not None  # it came from the zygote, not from here
        p = running(w)
        assert p.ppid() == os.getpid() and p not in zygote.children()
        assert p.name() == psutil.Process().name()  # not shown as the zygote
        sup.send(w, signal.SIGKILL)
        assert sup.wait_exit(w, 5.0)  # waitpid works: ours to reap
        assert w.exit_status is not None and os.WTERMSIG(w.exit_status) == signal.SIGKILL
        replacement = sup.spawn(0)
        assert sup.slots[0] is replacement and running(replacement).ppid() == os.getpid()
    finally:
        sup.stop_all(grace=1.0)
    assert not any(w.alive for w in sup.workers)
    assert sup.zygote is None and not zygote.is_running()  # stopped and reaped


def test_the_zygote_ignores_sigint_exits_on_sigterm_and_the_runner_then_forks_itself(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    zygote = sup.zygote
    assert zygote is not None
    try:
        os.kill(zygote.pid, signal.SIGINT)  # a terminal's Ctrl-C: the runner's to act on
        running(sup.spawn(0))
        assert sup.zygote is zygote
        os.kill(zygote.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while psutil.Process(zygote.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        workers = [sup.spawn(1)]
        if sup.zygote is not None:  # the spare it had made before it ended
            workers.append(sup.spawn(2))
        assert sup.zygote is None and zygote.pid == 0  # given up on, and reaped
        assert all(running(w).ppid() == os.getpid() for w in workers)
    finally:
        sup.stop_all(grace=1.0)


def test_the_zygote_ends_at_the_end_of_its_socket_and_its_spare_with_it(tmp_path: Path) -> None:
    before = set(psutil.Process().children())
    zygote = Zygote.start(lambda name, slot: None, tmp_path / "zygote.log")
    assert zygote is not None
    status = zygote.stop(timeout=5.0)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0  # not SIGKILLed
    assert set(psutil.Process().children()) == before  # its spare too is gone, and reaped


def test_a_spare_that_died_before_it_was_given_work_is_reaped_and_the_next_one_used(tmp_path: Path) -> None:
    # A process of an earlier test still on its way out is a child of ours too (we are its subreaper),
    # with the same command line: only those that were not there before are this supervisor's.
    before = {p.pid for p in psutil.Process().children()}
    sup = supervisor(tmp_path)
    assert sup.zygote is not None
    zygote, me = sup.zygote, psutil.Process()
    try:
        deadline = time.monotonic() + 5
        ours = {zygote.pid, sup.watchdog.pid} | before

        def spares() -> list[psutil.Process]:
            found = []
            for p in me.children():
                with contextlib.suppress(psutil.NoSuchProcess):  # one that goes meanwhile is no spare
                    if p.pid not in ours and p.cmdline() == me.cmdline():
                        found.append(p)
            return found

        while not (found := spares()):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        (spare,) = found
        spare.kill()
        while spare.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        w = sup.spawn(0)
        assert sup.zygote is zygote and w.pid != spare.pid and running(w).ppid() == me.pid
        assert not psutil.pid_exists(spare.pid)  # reaped
    finally:
        sup.stop_all(grace=1.0)


def test_neither_the_zygote_nor_its_workers_hold_what_the_runner_allocated_after_it_started(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    assert sup.zygote is not None
    ballast = b"x" * BALLAST
    try:
        zygote = rss(sup.zygote.pid)
        through = rss(sup.spawn(0).pid)
        sup.zygote.stop()  # from now on, forked from here
        direct = rss(sup.spawn(1).pid)
        # A worker forked from here holds the ballast (the check below can fire); compared with that
        # worker, not with this process, whose RSS in a long test session holds more than a child maps.
        assert direct > BALLAST
        assert max(zygote, through) < direct - BALLAST * 9 // 10
    finally:
        sup.stop_all(grace=1.0)
    del ballast


def test_a_crash_run_forks_every_worker_from_a_zygote_started_before_its_job_list(
    valkey_url: str, small: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    ballast: list[bytes] = []
    seen: list[tuple[int, ...]] = []  # at each spawn: the runner's RSS, the zygote's, the worker's, the watchdog's
    job_ids, spawn = runner.job_ids, Supervisor.spawn

    def large_job_ids(n: int) -> list[str]:
        ballast.append(b"x" * BALLAST)  # as if the job list were that large
        return job_ids(n)

    def measured_spawn(sup: Supervisor, slot: int) -> WorkerProcess:
        w = spawn(sup, slot)
        assert sup.zygote is not None
        seen.append((rss(os.getpid()), rss(sup.zygote.pid), rss(w.pid), rss(sup.watchdog.pid)))
        return w

    monkeypatch.setattr(runner, "job_ids", large_job_ids)
    monkeypatch.setattr(Supervisor, "spawn", measured_spawn)
    sc = small.replace(jobs=600, kills=2, interval=0.05)  # 1.5 s of work: late kills find a job
    run = run_designs(sc, ["reliable"], Options(redis_url=valkey_url)).runs[0]
    ballast.clear()
    assert run.problems == [] and run.counts.kills_mid_job == 2 and run.counts.done == 600
    assert len(seen) == sc.workload.workers + 2  # the replacements too
    for me, *others in seen:  # the watchdog too was forked before the job list (reaper.Watchdog.start)
        assert max(others) < me - BALLAST * 9 // 10


def test_a_wall_clock_step_after_spawn_leaves_the_worker_the_runner_s_to_kill_and_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil's start time is the boot time plus ticks, and the boot time moves when the clock is
    stepped (NTP on a CI machine): a worker must not be disowned for it, neither by a fault's signal nor
    by the stop at the end, or it is left running (the failure: "pid N is no longer w2")."""
    from psutil import _pslinux

    sup = supervisor(tmp_path)
    try:
        killed, kept = sup.spawn(0), sup.spawn(1)
        running(killed), running(kept)
        stepped = _pslinux.boot_time() + 1.0
        monkeypatch.setattr(_pslinux, "boot_time", lambda: stepped)
        sup.send(killed, signal.SIGKILL)
        assert sup.wait_exit(killed, 5.0) and killed.exit_status is not None
        assert os.WTERMSIG(killed.exit_status) == signal.SIGKILL
    finally:
        sup.stop_all(grace=1.0)
    assert not kept.alive and not psutil.pid_exists(kept.pid)
