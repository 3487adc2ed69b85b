"""Processes that escape their worker: a child subreaper, session sweeps, and a watchdog.

A library's child may leave its worker's process group (RQ's work horse calls setpgrp) and outlive
the worker. It stays in the worker's session (each worker is a session leader), and crashbench is a
child subreaper (PR_SET_CHILD_SUBREAPER), so such orphans are re-parented to crashbench instead of
init: `end_sessions` finds them there, stops them and reaps them. If crashbench itself is SIGKILLed,
its workers die with it (PR_SET_PDEATHSIG) but their children would not: the `Watchdog`, told each
worker's session, sees its lifeline pipe close without a goodbye, SIGKILLs whatever is left in those
sessions and removes the memory cgroups the workers made (crashbench.control.memlimit). Linux-specific
where it says so; elsewhere the subreaper and the death signal are no-ops and the sweeps look through
every process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from crashbench.control import memlimit

PR_SET_PDEATHSIG = 1
STOPS = {signal.SIGINT, signal.SIGTERM}  # how crashbench is asked to stop; blocked across its forks
PR_SET_CHILD_SUBREAPER = 36
_subreaper = False  # whether this process is a child subreaper (set once, for the process's life)
_lifelines: set[int] = set()  # write ends of this process's watchdog pipes: no child may hold one


def stat_fields(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command's name, from the state on: [0] state, [1] ppid,
    ..., [19] starttime (Linux). Raises OSError when there is no such process."""
    with open(f"/proc/{pid}/stat", "rb") as f:  # "pid (comm) state ppid ... starttime(22nd) ..."
        return f.read().rsplit(b")", 1)[1].split()


def started_at(pid: int) -> float:
    """When `pid` started, for telling apart processes: on Linux its start in clock ticks since boot
    (/proc/PID/stat), which no change of the wall clock moves (psutil's create_time adds the boot time,
    and that moves when the clock is stepped); elsewhere psutil's create_time. Raises psutil.Error, or
    OSError, when there is no such process."""
    try:
        return float(stat_fields(pid)[19])
    except (FileNotFoundError, ProcessLookupError):
        if sys.platform.startswith("linux"):
            raise psutil.NoSuchProcess(pid) from None
        return float(psutil.Process(pid).create_time())


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return bool(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def become_subreaper() -> bool:
    """Orphans below this process (an RQ work horse whose worker died, the server a wrapper script
    started) are re-parented to it instead of init: they stay in its tree, where they can be found
    and reaped. Linux only; elsewhere `in_sessions` looks through every process instead."""
    global _subreaper
    _subreaper = _subreaper or _prctl(PR_SET_CHILD_SUBREAPER, 1)
    return _subreaper


def in_sessions(sids: set[int], everywhere: bool = False) -> list[psutil.Process]:
    """Processes in one of the sessions `sids` (besides their leaders' children: whatever left their
    process group but not their session). Below this process when it is a subreaper, else anywhere.
    A session id cannot be reused while any process is still in that session."""
    if not sids:
        return []
    candidates = psutil.Process().children(recursive=True) if _subreaper and not everywhere else psutil.process_iter()
    found = []
    for p in candidates:
        with contextlib.suppress(OSError):
            if p.pid != os.getpid() and os.getsid(p.pid) in sids:
                found.append(p)
    return found


def end_sessions(sids: set[int], grace: float, keep: frozenset[int] = frozenset()) -> None:
    """SIGTERM every process in sessions `sids` (but pids in `keep`), SIGKILL those still there after
    `grace`, and reap the ones re-parented to this process (no zombie of ours is left)."""
    me = os.getpid()
    deadline = time.monotonic() + grace
    sig: int = signal.SIGTERM if grace > 0 else signal.SIGKILL
    signalled: set[psutil.Process] = set()
    hard_stop = deadline + 5.0
    while time.monotonic() < hard_stop:
        left = []
        for p in in_sessions(sids):
            if p.pid in keep:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if p.ppid() == me and os.waitpid(p.pid, os.WNOHANG)[0]:
                    continue  # a zombie of ours, now reaped
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue  # another's zombie: it has stopped all the same
                left.append(p)
        if not left:
            return
        if sig == signal.SIGTERM and time.monotonic() >= deadline:
            sig, signalled = signal.SIGKILL, set()
        for p in left:
            if p not in signalled:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)  # psutil checks the start time: a reused pid is not signalled
                signalled.add(p)
        time.sleep(0.002)


class Watchdog:
    """A process that SIGKILLs what a SIGKILLed crashbench leaves in its workers' sessions.

    It reads session ids from a pipe whose only write end crashbench holds. `close` says goodbye and
    it exits; if the pipe closes without one, crashbench died without stopping its processes, and
    the watchdog SIGKILLs every process still in those sessions (created after it started), then
    exits. It is a process of crashbench's own, and outlives it by milliseconds only."""

    def __init__(self) -> None:
        self.pid = 0
        self.fd = -1

    def start(self) -> None:
        """Fork it now, if it does not run yet: a fork keeps every page of this process's heap it
        shares until this process writes it, so forked from a large runner it would come to hold a
        copy of whatever the runner touches for the rest of the run."""
        if self.fd < 0:
            self._start()

    def watch(self, sid: int) -> None:
        self.start()
        with contextlib.suppress(OSError):  # it was killed: go on without it
            os.write(self.fd, f"{sid}\n".encode())

    def _start(self) -> None:
        read, write = os.pipe()  # non-inheritable: an exec'd worker does not keep it open
        pid = os.fork()
        if pid == 0:
            try:
                os.close(write)
                close_lifelines()
                _guard(read)
            finally:
                os._exit(0)
        os.close(read)
        self.pid, self.fd = pid, write
        _lifelines.add(write)

    def close(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self.fd, b"done\n")
        os.close(self.fd)
        _lifelines.discard(self.fd)
        self.fd = -1
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)  # it exits on the goodbye at once


def log_to(log: Path) -> None:
    """In a new child of crashbench: nothing on stdin, stdout and stderr appended to `log`."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in {null, out} - {0, 1, 2}:
        os.close(fd)
    # The parent's sys.stdout/stderr may be wrappers of its own (a test runner's capture): rebind.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def close_lifelines() -> None:
    """In a new child of crashbench: hold no watchdog's pipe open."""
    for fd in _lifelines:
        os.close(fd)
    _lifelines.clear()


def _guard(lifeline: int) -> None:
    """The watchdog's body: in its own session (a terminal's Ctrl-C is crashbench's to handle), with
    no file of crashbench's open (a caller reading crashbench's output must see it end)."""
    started = started_at(os.getpid())
    runner = os.getppid()
    os.setsid()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, lifeline)
    os.closerange(lifeline + 1, 1 << 16)
    sids: set[int] = set()
    buffered = b""
    while chunk := os.read(lifeline, 4096):
        *lines, buffered = (buffered + chunk).split(b"\n")
        for line in lines:
            if line == b"done":
                return
            sids.add(int(line))
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # until a pass finds nothing: a dying process may still fork
            left = []
            for p in in_sessions(sids, everywhere=True):
                with contextlib.suppress(psutil.Error):
                    if started_at(p.pid) >= started and p.status() != psutil.STATUS_ZOMBIE:
                        left.append(p)
                        p.kill()
            if not left:
                return
            time.sleep(0.01)
    finally:
        memlimit.remove_cgroups(runner)  # the workers' memory cgroups, empty now (crashbench.control.memlimit)
