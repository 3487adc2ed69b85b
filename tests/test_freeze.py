"""Freezing a worker's process tree (crashbench.control.supervisor.Supervisor.freeze): every process in
it is stopped by the kernel before a fault reads its time, also a child the worker forked between
the tree's first listing and its own stop (an RQ work horse for the next job): a missed one ran its
job on through the fault and finished it (a mid-job kill with nothing interrupted)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from crashbench.control.supervisor import Supervisor


def forking_worker(tmp_path: Path) -> Callable[[str, int], Callable[[], int]]:
    """A worker that forks one child (an RQ work horse's stand-in), which writes its pid to `child`."""

    def prepare(name: str, slot: int) -> Callable[[], int]:
        def body() -> int:
            if os.fork() == 0:  # the "horse"
                (tmp_path / "child").write_text(str(os.getpid()))
                time.sleep(60)
                os._exit(0)
            time.sleep(60)
            return 0

        return body

    return prepare


def forked_child(tmp_path: Path) -> psutil.Process:
    """The forking worker's child, once it wrote its pid."""
    deadline = time.monotonic() + 10
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text():
        assert time.monotonic() < deadline, "the worker never forked its child"
        time.sleep(0.005)
    return psutil.Process(int((tmp_path / "child").read_text()))


def test_a_child_forked_after_the_tree_was_listed_is_frozen_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = Supervisor(forking_worker(tmp_path), tmp_path, time.monotonic, tree=True)
    w = sup.spawn(0)
    child = None
    try:
        child = forked_child(tmp_path)
        real = sup._family
        calls = []

        def first_list_misses_the_child(worker):  # type: ignore[no-untyped-def]
            calls.append(1)
            family = real(worker)
            return family[:1] if len(calls) == 1 else family  # as if the child came after the listing

        monkeypatch.setattr(sup, "_family", first_list_misses_the_child)
        assert sup.freeze(w)
        assert psutil.Process(w.pid).status() == psutil.STATUS_STOPPED
        assert child.status() == psutil.STATUS_STOPPED
    finally:
        monkeypatch.undo()
        if child is not None and child.is_running():
            child.kill()
        sup.stop_all(grace=0.5)


def test_the_process_running_the_handler_is_stopped_first_and_no_other(tmp_path: Path) -> None:
    """A mid-job fault stops the process its victim's ledger names before it lists the tree (a 20 ms job
    is over by the time a loaded machine lists it): a child of the worker, or the worker itself; any
    other pid (gone, or reused since the ledger was read) is left alone."""

    sup = Supervisor(forking_worker(tmp_path), tmp_path, time.monotonic, tree=True)
    w = sup.spawn(0)
    stranger = subprocess.Popen(["sleep", "60"])
    child = None
    try:
        child = forked_child(tmp_path)
        sup.stop_first(w, stranger.pid)  # not below the worker
        sup.stop_first(w, child.pid)
        deadline = time.monotonic() + 10
        while child.status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the handler's process was never stopped"
            time.sleep(0.001)
        assert psutil.Process(w.pid).status() != psutil.STATUS_STOPPED  # the rest waits for freeze
        assert psutil.Process(stranger.pid).status() != psutil.STATUS_STOPPED
        sup.stop_first(w, w.pid)
        deadline = time.monotonic() + 10
        while psutil.Process(w.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the worker itself was never stopped"
            time.sleep(0.001)
    finally:
        stranger.kill()
        stranger.wait()
        if child is not None and child.is_running():
            child.kill()
        sup.thaw(w)
        sup.stop_all(grace=0.5)
