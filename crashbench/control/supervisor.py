"""Worker processes: fork, signal, freeze, reap, and stop every one of them, always.

Workers are forked from a process that has already imported redis-py and the design, so a
replacement is ready in milliseconds instead of the ~0.3 s a cold `python -c 'import redis'` costs:
the run's fork server (crashbench.control.zygote), whose size does not grow with the run's, once it has
one, else the runner itself. Either way a worker is the runner's child. Each worker is a real,
separate process in its own session (a terminal's Ctrl-C reaches crashbench only, which then stops
workers in order) and dies with its parent (PR_SET_PDEATHSIG on Linux).

Identity: a child stays a zombie until its parent reaps it, so a pid we have not reaped cannot
belong to anyone else. We reap only here, and check the process's start time before each signal.
With `tree`, a fault goes to the worker and every process below it (a library's per-job child, which
may have left the worker's process group): those are found through psutil, whose signals check the
start time too.

Escapees (a work horse that left its worker's process group and outlived it): `stop_all` ends
whatever is left in the workers' sessions, and a watchdog does so if crashbench is SIGKILLed
(crashbench.control.reaper).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psutil

from crashbench.control import pidns
from crashbench.control.reaper import (
    STOPS,
    Watchdog,
    become_subreaper,
    close_lifelines,
    die_with_parent,
    end_sessions,
    log_to,
)
from crashbench.control.zygote import Zygote
from crashbench.model.queue import SLOT_ENV

# Every signal a fault may send that a process can ignore (crashbench.scenario.settings.FAULT_SIGNALS,
# bar SIGKILL and SIGSTOP), and SIGCHLD: a worker starts with the defaults, as a deployed one does (a
# library then installs its own handlers). An ignored signal is inherited across fork and exec, and
# crashbench itself may run with some ignored: a shell without job control starts a background command
# (`make test &`, a CI step) with SIGINT and SIGQUIT ignored; a worker that inherited them would shrug
# off the very faults made on it. SIGHUP alone is left as crashbench got it: under nohup a deployment's
# workers ignore it too, and the kernel's own SIGHUP to an orphaned process group is part of what a
# kill does to a library's tree (Supervisor.send kills leaves first for it).
DEFAULT_IN_WORKERS = (
    signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGABRT, signal.SIGSEGV, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGCHLD,
)  # fmt: skip


@dataclass(slots=True)
class WorkerProcess:
    name: str
    slot: int
    pid: int
    spawned_at: float
    log: Path
    exit_status: int | None = None  # waitpid status once reaped
    exited_at: float | None = None
    signalled: int | None = None  # the fault signal we sent, if any
    control: Path | None = None  # a worker on a host over SSH: its stub's socket (crashbench.control.sshworker)

    @property
    def alive(self) -> bool:
        return self.exit_status is None

    def describe_exit(self) -> str:
        if self.exit_status is None:
            return "running"
        if os.WIFSIGNALED(self.exit_status):
            return f"killed by {signal.Signals(os.WTERMSIG(self.exit_status)).name}"
        return f"exit code {os.WEXITSTATUS(self.exit_status)}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Supervisor:
    """Owns every worker process of one run.

    `prepare(name, slot)` returns the worker body, which runs in the child and returns its exit code.
    It is called where the worker is forked: in this process before a fork of its own, or, with a
    zygote (`start_zygote`), in the new worker itself, so it must change nothing this process relies
    on. What must be done here before each worker starts (register its ledger file, ...) is
    `register(name, slot)`. `place(slot)`: the PID namespace the slot's worker starts in (a host's,
    crashbench.faults.hosts; forked from here, never the zygote), or None: this process's own.
    `control(name, slot)`: for a slot on a host over SSH, the socket its stub (the local process that
    mirrors the remote worker) takes signals on, or None: every signal goes to the process itself.
    """

    def __init__(
        self,
        prepare: Callable[[str, int], Callable[[], int]],
        log_dir: Path,
        clock: Callable[[], float],
        tree: bool = False,
        register: Callable[[str, int], object] | None = None,
        place: Callable[[int], int | None] | None = None,
        control: Callable[[str, int], Path | None] | None = None,
    ) -> None:
        self.prepare = prepare
        self.place = place
        self.control = control
        self.register = register
        self.tree = tree
        self.log_dir = log_dir
        self.clock = clock
        self.workers: list[WorkerProcess] = []  # every worker ever started, in order
        self.slots: dict[int, WorkerProcess] = {}  # slot -> its current worker
        self._pid = os.getpid()
        self.watchdog = Watchdog()
        self.zygote: Zygote | None = None

    def start_zygote(self) -> None:
        """Fork workers from now on from a fork server started now (crashbench.control.zygote): started
        before this process grows, it keeps a restart as cheap as it is now. Stopped by `stop_all`;
        without one (not Linux, or it failed) workers are forked from here. The watchdog is forked
        now too, for the same reason (see Watchdog.start)."""
        self.watchdog.start()
        if self.zygote is None:
            self.zygote = Zygote.start(self._adopted, self.log_dir / "zygote.log")

    def spawn(self, slot: int) -> WorkerProcess:
        name = f"w{len(self.workers)}"
        log = self.log_dir / f"{name}.log"
        if self.register is not None:
            self.register(name, slot)
        become_subreaper()
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked across the fork: a SIGTERM or SIGINT for the new child (stop_all right after a spawn)
        # or for crashbench must not run crashbench's own Python handler in the child, which would
        # raise there, inside the interpreter's at-fork hooks, and print to crashbench's stderr. The
        # child unblocks once its handlers are the defaults; the parent at once. And across the hand-over
        # of the zygote's spare: an interrupt must not leave a worker running whose pid we never kept.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            ns = self.place(slot) if self.place is not None else None
            control = self.control(name, slot) if self.control is not None else None
            if ns is not None or control is not None:  # on a host: a fork of its own from here
                pid = self._fork(log, self.prepare(name, slot), slot, ns)
            else:
                pid = self.zygote.spawn(name, slot) if self.zygote is not None else 0
            if not pid:
                self.zygote = None  # none, or it failed and is stopped: fork from here
                pid = self._fork(log, self.prepare(name, slot), slot)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        worker = WorkerProcess(name, slot, pid, self.clock(), log)
        worker.control = control
        self.watchdog.watch(pid)  # its session id: the worker calls setsid
        self.workers.append(worker)
        self.slots[slot] = worker
        return worker

    def _fork(self, log: Path, body: Callable[[], int], slot: int, ns: int | None = None) -> int:
        pid = os.fork() if ns is None else pidns.fork_into(ns)
        if pid == 0:
            self._run(log, body, slot, self._pid if ns is None else pidns.OUTSIDE)
        return pid

    def _adopted(self, name: str, slot: int) -> None:
        """In the zygote's spare (already this process's child), once told it is worker `name`."""
        self._run(self.log_dir / f"{name}.log", lambda: self.prepare(name, slot)(), slot)

    def _run(self, log: Path, body: Callable[[], int], slot: int, parent: int | None = None) -> NoReturn:
        """The new worker: never return into the caller. `parent`: its parent's pid as it sees it."""
        code = 1
        try:
            self._become_worker(log, slot, self._pid if parent is None else parent)
            code = body()
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)

    def _become_worker(self, log: Path, slot: int, parent: int) -> None:
        # Inherited by a --worker-python exec too: a design whose replacement takes over its slot's
        # identity (stream-reuse's consumer name) reads it; the worker's own name is new at every spawn.
        os.environ[SLOT_ENV] = str(slot)
        os.setsid()
        die_with_parent()
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)
        close_lifelines()  # the watchdog must see its pipe close when crashbench dies
        for signum in DEFAULT_IN_WORKERS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        log_to(log)

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def reap(self) -> list[WorkerProcess]:
        """Collect workers that exited since the last call."""
        gone = []
        for w in self.alive():
            pid, status = os.waitpid(w.pid, os.WNOHANG)
            if pid:
                w.exit_status, w.exited_at = status, self.clock()
                gone.append(w)
        return gone

    def _check_identity(self, w: WorkerProcess) -> None:
        # A worker is this process's child: until reap() waits for it, its pid (a zombie's at worst)
        # cannot be given to another process, so "not reaped yet" is its whole identity. (A start time
        # is no proof: psutil adds the boot time, which moves when the wall clock is stepped, and a
        # worker compared that way was disowned and left running.)
        if not w.alive:
            raise ProcessLookupError(f"{w.name} (pid {w.pid}) was already reaped")

    def _family(self, w: WorkerProcess) -> list[psutil.Process]:
        """The worker, then (with `tree`) every process below it."""
        try:
            root = psutil.Process(w.pid)
            return [root, *root.children(recursive=True)] if self.tree else [root]
        except psutil.NoSuchProcess:
            return []

    def send(self, w: WorkerProcess, sig: int, whole_tree: bool = True) -> list[psutil.Process]:
        """Signal `w` (and, with `tree`, every process below it); returns the processes below that got it."""
        self._check_identity(w)
        if w.control is not None:
            self._remote(w, sig, whole_tree)
            return []
        # List the tree before signalling: once the worker dies its children are re-parented and can
        # no longer be found from it.
        below = self._family(w)[1:] if self.tree and whole_tree else []
        # Leaves first: a child whose parent dies first has its process group orphaned, and the kernel
        # sends a stopped one SIGHUP and SIGCONT. Where SIGHUP is ignored (nohup, a CI runner) a frozen
        # RQ work horse would wake and finish the job it was meant to die in before its own signal came.
        for p in reversed(below):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        os.kill(w.pid, sig)
        return below

    def _remote(self, w: WorkerProcess, sig: int, whole_tree: bool) -> None:
        """A signal for a worker over SSH, through its stub; the stub itself when it does not answer (gone,
        or stuck), which takes the remote worker down with the connection (it stops on its own)."""
        from crashbench.control.sshworker import signal_remote

        assert w.control is not None
        if not signal_remote(w.control, sig, whole_tree and self.tree, lambda: self._running(w)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL if sig in (signal.SIGKILL, signal.SIGTERM) else sig)

    def _running(self, w: WorkerProcess) -> bool:
        try:
            return psutil.Process(w.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def own_pid(self, w: WorkerProcess) -> int:
        """The worker's pid as it sees it (in a host's PID namespace, that namespace's): what its ledger holds."""
        return pidns.own_pid(w.pid) or w.pid

    def send_below(self, w: WorkerProcess, pid: int, sig: int) -> psutil.Process | None:
        """Signal the process below worker `w` (never `w` itself) whose own pid is `pid`, as the worker's
        ledger records it (on a host, its PID namespace's pid: pidns.own_pid); the process, or None."""
        for p in self._family(w)[1:]:
            if pidns.own_pid(p.pid) == pid:
                p.send_signal(sig)  # psutil checks the start time: a reused pid is not signalled
                return p
        return None

    def deliver(self, w: WorkerProcess, sig: int, target: str, child: int, frozen: bool) -> tuple[str, list]:
        """A fault signal to `target` of worker `w` (frozen or not): "child", only the process below it
        that runs the job, `child` by the ledger's pid (send_below; the worker lives on); "parent", the
        worker alone, the rest of its tree left running; anything else, the whole tree. Returns the target
        hit and the processes below `w` that got the signal (to wait for with `wait_dead`)."""
        if target == "child" and child and (proc := self.send_below(w, child, sig)):
            if frozen:
                self.thaw(w)
            return "child", [proc]
        if target == "child":
            target = "worker"  # the job runs in the worker process itself
        rest = self.below(w) if target == "parent" else []
        w.signalled = sig
        below = self.send(w, sig, whole_tree=target != "parent")
        for p in rest if frozen else []:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)  # the orphans go on as they would
        if frozen and sig != signal.SIGKILL:
            self.thaw(w)  # let it act on the signal
        return target, below

    def wait_dead(self, w: WorkerProcess | None, below: list[psutil.Process], timeout: float = 5.0) -> None:
        """Until the SIGKILLed worker (None: it was spared) and the processes below it are gone."""
        if w is not None:
            self.wait_exit(w, timeout)
        # Not our children: once their worker died nobody here can reap them, and a zombie (whose new
        # parent may never reap it, as in a container) has stopped writing all the same.
        deadline = time.monotonic() + timeout
        for p in below:
            while time.monotonic() < deadline:
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.0005)

    def below(self, w: WorkerProcess) -> list[psutil.Process]:
        return self._family(w)[1:]

    def stop_first(self, w: WorkerProcess, pid: int) -> None:
        """SIGSTOP `pid` at once if it is `w` or a child of `w`: the process running a handler, stopped
        before `freeze` lists the tree, which takes milliseconds on a loaded machine, long enough for a
        short job to end. `pid` is the ledger's (on a host, its PID namespace's: pidns.outer finds the
        process by it). Any other pid (gone, or reused by then) is left alone."""
        if not w.alive or w.control is not None or (target := pidns.outer(w.pid, pid)) is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGSTOP)

    def freeze(self, w: WorkerProcess, timeout: float = 1.0) -> bool:
        """SIGSTOP `w` (and its tree) and wait until the kernel reports every one stopped, so its
        ledger can no longer move."""
        self.send(w, signal.SIGSTOP)
        if w.control is not None:
            return True  # its stub answered once the host's kernel reported it stopped
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Listed again each time: a child forked after the first list, before the worker stopped
            # (an RQ work horse for the next job), is stopped too; a stopped worker forks no more.
            running = []
            for p in self._family(w):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if p.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                        running.append(p)
            if not running:
                return True
            for p in running:  # again for one on its way to stopping: harmless
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGSTOP)
        return False

    def thaw(self, w: WorkerProcess) -> None:
        if w.alive:
            self.send(w, signal.SIGCONT)

    def wait_exit(self, w: WorkerProcess, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while w.alive:
            pid, status = os.waitpid(w.pid, os.WNOHANG)
            if pid:
                w.exit_status, w.exited_at = status, self.clock()
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True

    def stop_all(self, grace: float) -> None:
        """SIGTERM every live worker, SIGKILL whoever is still there after `grace`, reap them all; and
        the zygote: no worker starts from it after this."""
        if self.zygote is not None:
            self.zygote.stop()
            self.zygote = None
        for w in self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.send(w, signal.SIGTERM, whole_tree=False)  # the worker decides what its children do
                self.thaw(w)  # a frozen worker cannot act on SIGTERM
        deadline = time.monotonic() + grace
        for w in self.alive():
            self.wait_exit(w, max(0.0, deadline - time.monotonic()))
        for w in self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.send(w, signal.SIGKILL)
            self.wait_exit(w, 5.0)
        # What left its worker's process group and outlived it (a work horse, a pool process): every
        # worker has exited now, so whatever is still in their sessions is left over.
        end_sessions({w.pid for w in self.workers}, grace=0.0, keep=frozenset(w.pid for w in self.alive()))
        if not self.alive():
            self.watchdog.close()
