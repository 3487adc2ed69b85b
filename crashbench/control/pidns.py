"""PID namespaces, for hosts (crashbench.faults.hosts): an init process at PID 1 of a new namespace, and
workers forked into that namespace from this process, so that each stays this process's child (the
supervisor waits for it, signals it and knows it as any worker: crashbench.control.supervisor).

    Init.start()        forks the namespace's init: unshare(CLONE_NEWPID) here, fork, and this thread's
                        children go back to this process's own namespace at once. The init execs a
                        small reaper loop (it holds none of the runner's memory or descriptors) and dies
                        with this process (PR_SET_PDEATHSIG).
    fork_into(ns)       os.fork() with the child in namespace `ns` (setns on this thread, fork, back).
    Init.kill()         SIGKILL to the init: the kernel then SIGKILLs every process in its namespace at
                        once, a host's crash. The namespace is dead then: nothing can be forked into it.
                        The init is reapable (Init.reap) once the workers forked into it are reaped.
    members(init)       the pids (in this process's namespace) of every process in the init's namespace.
    own_pid(pid)        a process's pid as it sees it (os.getpid() in it, what it writes in its ledger).
    outer(root, pid)    `root` or a child of it by that own pid: the pid to signal it by from here.

Inside the namespace a worker's parent (this process) is outside: os.getppid() answers 0 there while this
process lives, and 1 (the init) once it is gone. Linux only; root (CAP_SYS_ADMIN) for unshare and setns.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from crashbench.control.reaper import STOPS, close_lifelines, die_with_parent

CLONE_NEWPID = 0x20000000
OUTSIDE = 0  # what os.getppid() answers in a namespace whose parent process is outside it

# The init's whole program: reap whatever is orphaned into it (a library's child whose worker died), for ever.
# PID 1 of a namespace gets no signal it has no handler for from inside it; SIGKILL from outside ends it.
INIT = """import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    signal.sigwait({signal.SIGCHLD})
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
"""


class PidnsError(OSError):
    """A namespace could not be made or entered (not Linux, not root, or it is dead)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args: int) -> None:
    if getattr(_libc(), name)(*args) != 0:
        err = ctypes.get_errno()
        raise PidnsError(err, f"{name} (a PID namespace): {os.strerror(err)}")


def _own() -> int:
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


@dataclass(slots=True)
class Init:
    """A namespace's init: its pid here, a descriptor of its namespace (valid after it died, so a late
    fork fails cleanly instead of entering whatever reuses its pid), the namespace's inode."""

    pid: int
    ns: int
    inode: int
    status: int | None = None  # waitpid status once reaped

    @classmethod
    def start(cls, log: Path) -> Init:
        own = _own()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # as for a worker: no handler of ours in the child
        armed, arming = os.pipe2(os.O_CLOEXEC)  # the init says when it will die with this process
        pid = -1
        try:
            _call("unshare", CLONE_NEWPID)
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
            finally:
                if pid != 0:
                    _call("setns", own, CLONE_NEWPID)  # this process's next children: its own namespace
            if pid == 0:
                _become_init(log, arming)
            os.close(arming)
            arming = -1
            # Not before its PR_SET_PDEATHSIG is set: a SIGKILL of this process in between left the init
            # (and all it would hold) running for good. An end at once if it died first.
            os.read(armed, 1)
        finally:
            if pid != 0:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
                for fd in (armed, arming, own):
                    if fd >= 0:
                        os.close(fd)
        # Our child, not reaped: its pid names it, and its namespace is open before anything can reap it.
        ns = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        return cls(pid, ns, os.fstat(ns).st_ino)

    def kill(self) -> None:
        """SIGKILL the init: the kernel SIGKILLs every process in its namespace with it. The init itself is
        reapable only once every other process of its namespace is gone, its workers (this process's
        children) reaped here: `reap` it after them."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def reap(self, timeout: float = 5.0) -> bool:
        """Wait up to `timeout` s for the killed init to be reaped; whether it was."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.status = status
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(0.001)
        if self.ns >= 0:
            os.close(self.ns)
            self.ns = -1
        return True


def _become_init(log: Path, armed: int) -> None:
    """In the forked init (PID 1 of its namespace): never return into the caller. One byte on `armed`
    once it dies with its parent."""
    try:
        os.setsid()
        die_with_parent()
        os.write(armed, b"1")
        close_lifelines()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, 65536)
        for signum in STOPS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", INIT])
    finally:
        os._exit(1)


def fork_into(ns: int) -> int:
    """os.fork(), the child in PID namespace `ns` (an Init's), this process's children back in its own
    namespace at once. Raises PidnsError when the namespace is dead (its init was killed)."""
    own = _own()
    try:
        _call("setns", ns, CLONE_NEWPID)
        pid = -1
        try:
            pid = os.fork()
        except OSError as exc:  # ENOMEM: the namespace's init is gone
            raise PidnsError(
                exc.errno, f"cannot fork into a PID namespace whose init is gone: {exc.strerror}"
            ) from None
        finally:
            if pid != 0:
                _call("setns", own, CLONE_NEWPID)
        return pid
    finally:
        os.close(own)


def members(init: Init) -> list[int]:
    """Every process in the init's namespace, init included, by its pid in this process's namespace."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/pid").st_ino == init.inode:
                    out.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
    return out


def own_pid(pid: int) -> int | None:
    """The pid of process `pid` (by its pid here) in the innermost PID namespace it is in: what os.getpid()
    answers in it, and what a worker writes in its ledger. The last field of /proc/<pid>/status's NSpid
    line (one field per namespace, this one's first). None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return pid  # a kernel without NSpid (before 4.1) has no namespaces to see through


def children(pid: int) -> list[int]:
    """The direct children of process `pid`, of every one of its threads (/proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{task}/children", "rb") as f:
            out += [int(c) for c in f.read().split()]
    return out


def outer(root: int, pid: int) -> int | None:
    """`root` or a direct child of it whose own pid (own_pid) is `pid`, by its pid here; None if none is.
    A worker in a host's PID namespace records the pids of that namespace: a pid read from its ledger
    names a process here only through this. Outside any namespace of ours own_pid(p) is p: the same test
    as "pid is root or a child of root"."""
    for p in (root, *children(root)):
        if own_pid(p) == pid:
            return p
    return None
