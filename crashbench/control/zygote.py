"""The fork server (a "zygote"): where a run's workers come from, so that a restart costs the same at
2,000 jobs and at 10,000,000.

Forking the runner itself makes every new worker pay for the runner's size: the fork copies page
tables for all of its heap, and the child's first writes and garbage-collector passes over that heap
fault pages in one by one. At a million jobs (the job list, the ledger's parsed executions: hundreds
of MB) a restart after a kill took 3x as long as at 2,000 jobs. The zygote is forked from the runner
once, early in a run, before the job list exists: it has imported redis-py and the design, holds the
worker's closures, and freezes its heap out of the collector's reach.

It keeps one spare ready: a process forked ahead of need that waits to be told its worker's name and
slot. A restart hands the slot to the spare (a write on a pipe, no fork, no round trip through the
zygote on the way), and the zygote forks the next spare meanwhile. A spare is the runner's child
from the start, so the supervisor waits for it, signals it and checks its identity as if the runner
had forked it (crashbench.control.supervisor): the zygote forks an intermediate that forks the spare and
exits at once, and the runner is a child subreaper (crashbench.control.reaper), so the kernel hands the
spare to the runner when the intermediate exits, before the zygote reaps it and passes the spare's
pid and the write end of its pipe to the runner (SCM_RIGHTS). Only once handed over does a spare ask
to die with its parent: the death signal follows the parent of the moment it is asked for, and the
intermediate's exit would fire it.

The zygote ignores SIGINT (a terminal's Ctrl-C reaches the whole foreground process group, and it is
the runner's to act on: it stops things in order), exits on SIGTERM, at the end of its socket (the
runner stops it, or died) and with the runner (PR_SET_PDEATHSIG). A spare that is never given work
exits at the end of its pipe and is reaped by `stop`. Whenever the zygote cannot answer, the
supervisor stops it and forks from the runner as before.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from crashbench.control.reaper import STOPS, become_subreaper, close_lifelines, die_with_parent, log_to

NAME = "cb-zygote"  # what `ps -o comm` and psutil's name() show for it
StartWorker = Callable[[str, int], None]  # in a spare once told its name and slot; never returns
Spare = tuple[int, int]  # its pid, and the write end of the pipe it waits on (0, -1: none)


class Zygote:
    """The runner's end: the zygote's pid, and a socket to it."""

    TIMEOUT = 10.0  # seconds for an answer; a zygote that takes longer is stopped and not asked again

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    @classmethod
    def start(cls, start_worker: StartWorker, log: Path) -> Zygote | None:
        """Fork the zygote; None where spares could not be re-parented to this process (not Linux)."""
        if not become_subreaper():
            return None
        runner = os.getpid()
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked across the fork, as for a worker (crashbench.control.supervisor): the runner's own
        # Python handler must never run in the zygote. It unblocks once its handlers are its own.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
            mine.close()
            its.close()
            raise
        if pid == 0:  # the zygote: never return into the runner
            code = 1
            try:
                mine.close()  # else its own copy would keep the socket from ever ending
                comm = _become_zygote(runner, log)
                its.send(b"ready")
                _serve(its, runner, comm, start_worker)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        its.close()
        zygote = cls(pid, mine)
        ready = False
        try:
            # Ready once its heap is frozen: a spare forked before would pay for the collection in it.
            ready = zygote._receive(cls.TIMEOUT)[0] == b"ready"
        finally:
            if not ready:  # not in time, or an interrupt is on its way out: nothing left running
                zygote.stop()
        return zygote if ready else None

    def _receive(self, timeout: float) -> tuple[bytes, list[int]]:
        """The zygote's next message and the descriptors it carries; empty at its end or after `timeout`."""
        with contextlib.suppress(OSError):
            if select.select([self.sock], [], [], max(0.0, timeout))[0]:
                message, fds, _, _ = socket.recv_fds(self.sock, 32, 1)
                return message, fds
        return b"", []

    def spawn(self, name: str, slot: int) -> int:
        """Worker `name` in `slot`: the pid of the spare now running it, this process's child; 0 when the
        zygote could not give one (it is stopped then)."""
        for _ in range(2):  # a spare that died before it was given work: the next one
            if not self.pid:
                return 0
            message, fds = self._receive(self.TIMEOUT)
            if not fds:  # it is gone, failed to fork, or is too slow
                break
            pid = int(message)
            try:
                os.write(fds[0], f"{name} {slot}\n".encode())
                return pid
            except BrokenPipeError:  # its end of the pipe is closed: it has exited
                os.waitpid(pid, 0)
            finally:
                os.close(fds[0])
                with contextlib.suppress(OSError):
                    self.sock.send(b"next")  # forked while this one starts, not when it is needed
        self.stop()
        return 0

    def stop(self, timeout: float = TIMEOUT) -> int | None:
        """End the zygote and reap it and its spare; its exit status (None: it had to be SIGKILLed).
        It ends at the end of its socket, once it has handed over the spare it may be forking: a
        SIGKILL then would leave that one running unknown to this process."""
        if not self.pid:
            return None
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        spares = []
        while (got := self._receive(deadline - time.monotonic()))[0]:
            message, fds = got
            for fd in fds:
                os.close(fd)  # the spare reads the end of its pipe and exits
                spares.append(int(message))
        self.sock.close()
        status = _end(self.pid, deadline)
        for pid in spares:
            _end(pid, time.monotonic() + 1.0)
        self.pid = 0
        return status


def _end(pid: int, deadline: float) -> int | None:
    """Reap child `pid` once it exits by `deadline`, else SIGKILL and reap it; its status, or None."""
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        time.sleep(0.001)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return None


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


def _serve(sock: socket.socket, runner: int, comm: str, start_worker: StartWorker) -> None:
    """A spare, then another each time the runner says "next", until the end of the socket. `comm`:
    the name a spare takes back."""
    try:
        while True:
            pid, fd = _fork_spare(sock, runner, comm, start_worker)
            try:
                if fd < 0:
                    sock.send(b"0")
                else:
                    socket.send_fds(sock, [str(pid).encode()], [fd])
            finally:
                if fd >= 0:
                    os.close(fd)
            if sock.recv(16) != b"next":
                return
    except (BrokenPipeError, ConnectionResetError):  # the runner is gone
        return


def _fork_spare(sock: socket.socket, runner: int, comm: str, start_worker: StartWorker) -> Spare:
    """Fork an intermediate that forks the spare and exits; once the intermediate is reaped, the spare
    is the runner's child."""
    assign_r, assign_w = os.pipe()  # the spare's work comes through it
    told_r, told_w = os.pipe()  # the intermediate tells the spare's pid through it
    try:
        middle = os.fork()
    except OSError:
        for fd in (assign_r, assign_w, told_r, told_w):
            os.close(fd)
        return 0, -1
    if middle == 0:  # the intermediate: never return into the zygote's loop
        code = 1
        try:
            sock.close()  # a spare holding the zygote's socket would keep it from ending
            os.close(told_r)
            os.close(assign_w)
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(told_w)
                _spare(assign_r, me, runner, comm, start_worker)
            else:
                os.write(told_w, str(pid).encode())
                code = 0
        finally:
            os._exit(code)
    os.close(told_w)
    os.close(assign_r)
    try:
        told = os.read(told_r, 32)  # the pid, or end of file: the intermediate's fork failed
    finally:
        os.close(told_r)
    os.waitpid(middle, 0)
    if not told:
        os.close(assign_w)
        return 0, -1
    return int(told), assign_w


def _spare(assign: int, middle: int, runner: int, comm: str, start_worker: StartWorker) -> None:
    """The spare: the runner's child once the intermediate has exited; then its work, or the end."""
    _rename(comm)
    while os.getppid() == middle:
        time.sleep(0.0001)
    die_with_parent()
    if os.getppid() != runner:  # the runner died before it was handed over
        os._exit(1)
    told = b""
    while not told.endswith(b"\n"):
        chunk = os.read(assign, 64)
        if not chunk:  # never given work: the run is over
            os._exit(0)
        told += chunk
    os.close(assign)
    name, slot = told.decode().split()
    start_worker(name, int(slot))
