"""The fork server (a "zygote"): where a run's workers are forked from, so that a restart costs the
same at 2,000 jobs and at 10,000,000.

Forking the runner itself makes every new worker pay for the runner's size: the fork copies page
tables for all of its heap, and the child's first writes and garbage-collector passes over that heap
fault pages in one by one. At a million jobs (the job list, the ledger's parsed executions: hundreds
of MB) a restart after a kill took 3x as long as at 2,000 jobs. The zygote is forked from the runner
once, early in a run, before the job list exists: it has imported redis-py and the design, holds the
worker's closures, freezes its heap out of the collector's reach, and forks every worker on request.

A worker stays the runner's child, so the supervisor waits for it, signals it and checks its
identity exactly as if the runner had forked it (crashbench.run.supervisor): the zygote forks an
intermediate process that forks the worker and exits at once, and the runner is a child subreaper
(crashbench.run.reaper), so the kernel hands the worker to the runner when the intermediate exits,
before the zygote has reaped it and sent the worker's pid back. Only then may the worker ask to die
with its parent: the death signal follows the parent of the moment it is asked for, and the
intermediate's exit would fire it.

The zygote ignores SIGINT (a terminal's Ctrl-C reaches the whole foreground process group, and it is
the runner's to act on: it stops things in order), exits on SIGTERM, when its request pipe closes,
and with the runner (PR_SET_PDEATHSIG). Whenever it cannot answer, the supervisor stops it and forks
from the runner as before.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from crashbench.run.reaper import STOPS, become_subreaper, close_lifelines, die_with_parent, log_to

NAME = "cb-zygote"  # what `ps -o comm` and psutil's name() show for it
# In the new worker: become worker `name` in `slot`; the int is the intermediate's pid (its parent
# until it exits). Never returns.
StartWorker = Callable[[str, int, int], None]


class Zygote:
    """The runner's end: the zygote's pid and the two pipes to it."""

    TIMEOUT = 10.0  # seconds for a reply; a zygote that takes longer is stopped and not asked again

    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid = pid
        self.requests = requests
        self.replies = replies

    @classmethod
    def start(cls, start_worker: StartWorker, log: Path) -> Zygote | None:
        """Fork the zygote; None where workers could not be re-parented to this process (not Linux)."""
        if not become_subreaper():
            return None
        runner = os.getpid()
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked across the fork, as for a worker (crashbench.run.supervisor): the runner's own
        # Python handler must never run in the zygote. It unblocks once its handlers are its own.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
            for fd in (requests_r, requests_w, replies_r, replies_w):
                os.close(fd)
            raise
        if pid == 0:  # the zygote: never return into the runner
            code = 1
            try:
                os.close(requests_w)  # else its own copy would keep the request pipe from ever closing
                os.close(replies_r)
                comm = _become_zygote(runner, log)
                os.write(replies_w, b"ready\n")
                _serve(requests_r, replies_w, start_worker, comm)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        os.close(requests_r)
        os.close(replies_w)
        zygote = cls(pid, requests_w, replies_r)
        # Ready once its heap is frozen: a worker forked before would pay for the collection in it.
        if zygote._reply() != b"ready\n":
            zygote.stop()
            return None
        return zygote

    def _reply(self) -> bytes:
        """The zygote's next reply; empty if it is gone or does not answer in time."""
        with contextlib.suppress(OSError):
            if select.select([self.replies], [], [], self.TIMEOUT)[0]:
                return os.read(self.replies, 32)
        return b""

    def spawn(self, name: str, slot: int) -> int:
        """Worker `name` forked by the zygote: its pid, of a child of this process by now; 0 when the
        zygote could not do it (it is stopped then)."""
        if not self.pid:
            return 0
        try:
            os.write(self.requests, f"{name} {slot}\n".encode())
            reply = self._reply()
        except BrokenPipeError:  # it is gone
            reply = b""
        pid = int(reply) if reply.strip() else 0
        if not pid:
            self.stop()
        return pid

    def stop(self) -> None:
        """End and reap the zygote (it holds nothing that needs a graceful stop)."""
        if not self.pid:
            return
        os.close(self.requests)
        os.close(self.replies)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.pid = 0


def _rename(name: str) -> str:
    """Set this process's name as `ps` and psutil show it (Linux); returns the one it had."""
    comm = Path("/proc/self/comm")
    with contextlib.suppress(OSError):
        before = comm.read_text().strip()
        comm.write_text(name)
        return before
    return name


def _become_zygote(runner: int, log: Path) -> str:
    """Its signals, output and heap; returns the name it had."""
    die_with_parent()
    if os.getppid() != runner:  # the runner died before the line above took effect
        os._exit(1)
    close_lifelines()  # a watchdog must see its pipe close when crashbench dies
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    log_to(log)  # no terminal or pipe of the runner's kept open, and its own errors kept
    # What the runner left for the collector goes now; the rest leaves the collector's reach, so a
    # worker's collections never walk (and copy, page by page) the zygote's heap.
    gc.collect()
    gc.freeze()
    return _rename(NAME)


def _serve(requests: int, replies: int, start_worker: StartWorker, comm: str) -> None:
    """One request at a time ("NAME SLOT\\n"), answered with the worker's pid ("0": its fork failed),
    until the request pipe closes. `comm`: the name a worker takes back."""
    buffered = b""
    while chunk := os.read(requests, 4096):
        *lines, buffered = (buffered + chunk).split(b"\n")
        for line in lines:
            name, slot = line.decode().split()
            pid = _fork_worker(name, int(slot), (requests, replies), comm, start_worker)
            try:
                os.write(replies, f"{pid}\n".encode())
            except BrokenPipeError:  # the runner is gone
                return


def _fork_worker(name: str, slot: int, pipes: tuple[int, int], comm: str, start_worker: StartWorker) -> int:
    """Fork an intermediate that forks the worker and exits; once the intermediate is reaped, the
    worker is the runner's child. Returns the worker's pid, 0 if a fork failed."""
    told_r, told_w = os.pipe()  # the intermediate tells the worker's pid through it
    try:
        middle = os.fork()
    except OSError:
        os.close(told_r)
        os.close(told_w)
        return 0
    if middle == 0:  # the intermediate: never return into the zygote's loop
        code = 1
        try:
            for fd in (told_r, *pipes):  # a worker holding the zygote's pipes would keep them open
                os.close(fd)
            me = os.getpid()
            pid = os.fork()
            if pid == 0:  # the worker
                code = 1
                os.close(told_w)
                _rename(comm)
                start_worker(name, slot, me)
            else:
                os.write(told_w, str(pid).encode())
                code = 0
        finally:
            os._exit(code)
    os.close(told_w)
    try:
        told = os.read(told_r, 32)  # the pid, or end of file: the intermediate's fork failed
    finally:
        os.close(told_r)
    os.waitpid(middle, 0)
    return int(told) if told else 0
