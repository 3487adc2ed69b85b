"""Nothing outlives a run: not on Ctrl-C, not when crashbench itself is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from crashbench import workdirs

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


def start_long_run(tag: str, tmp_path: Path) -> tuple[subprocess.Popen[str], set[psutil.Process]]:
    """A long compare, once its server and 4 workers run; and every process of it seen so far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", "compare", "--jobs", "20000", "--interval", "0.2", "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "CRASHBENCH_TEST_TAG": tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            family = set(psutil.Process(proc.pid).children(recursive=True)) | tagged(tag)
            if len(family) >= 6:  # crashbench + server + 4 workers
                return proc, family
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never started its workers"
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


def wait_until_gone(tag: str, seen: set[psutil.Process], timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in seen if running(p)} | tagged(tag)
        if not left or time.monotonic() > deadline:
            return [" ".join(p.cmdline()) for p in left]
        time.sleep(0.05)


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
    assert any(p.name().endswith("-server") for p in seen)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_until_gone(tag, seen) == []
    # Its temporary directories could not be removed by a dead process: the next session removes them.
    bases = [Path(tempfile.gettempdir()), workdirs.SHM]  # the run's ledgers may be in RAM
    orphans = [p for base in bases for p in base.glob(f"crashbench-*-{proc.pid}-*")]
    assert len(orphans) == 2  # the run's and the embedded server's
    assert sorted(workdirs.remove_orphans()) == sorted(orphans)
    assert not any(p.exists() for p in orphans)
