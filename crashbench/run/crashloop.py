"""A crash loop as the runner sees it: the workload's crash jobs (workload.crash_rate) kill the process
that runs them on every attempt, and the run must tell those deaths from a worker that broke.

- A worker that exits on its own (no fault aimed at it) with a crash job open in its ledger died of
  its job: it is replaced as usual and is neither a worker crash nor one of the exits that abort a run
  (`explains`). Where a library runs the job in a child (Celery's pool process, RQ's work horse) the
  child dies, not the worker, and the library itself decides what follows.
- The drain (crashbench.run.drain) counts a handler start as progress; a crash job started again is
  the loop going round, not progress (`starts`), so the observation window (run.drain_timeout, else
  the design's) ends a loop that never drains. An execution of a crash job whose process is gone does
  not keep its worker busy (`busy`): a library worker whose child died is idle.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from crashbench import jobids
from crashbench.control import memlimit, pidns
from crashbench.control.supervisor import WorkerProcess
from crashbench.model.ledger import Ledger
from crashbench.model.workload import Workload


class CrashLoop:
    def __init__(self, workload: Workload, ledger: Ledger, configuration: dict[str, object] | None = None) -> None:
        """`configuration`: the result's, given the memory limit the workers put on themselves, if any
        (crashbench.control.memlimit)."""
        self.workload, self.ledger = workload, ledger
        self.active = workload.crash_rate > 0
        self.warnings: list[str] = []  # for the run's warnings: a cgroup v1 that does not limit memory
        if configuration is not None and self.active and workload.crash_how == "memory":
            configuration["crash_memory_limit"] = memlimit.method()
            if reason := memlimit.choice().reason:
                self.warnings.append(f"memory crash jobs: {reason}; the workers use RLIMIT_AS instead")
        self._crash: dict[int, bool] = {}  # job code -> whether it is a crash job
        self._seen = 0  # ledger rows looked at by `starts`
        self._again = 0  # ... of which a crash job's start after its first
        self._started: set[int] = set()  # crash jobs started at least once

    def crashes(self, code: int) -> bool:
        found = self._crash.get(code)
        if found is None:
            found = self._crash[code] = self.workload.crashes(jobids.name(code))
        return found

    def explains(self, worker: str) -> bool:
        """Did `worker`, which exited on its own, die of a crash job (one open in its final ledger)?"""
        if not self.active:
            return False
        self.ledger.poll(worker)
        return any(self.crashes(jobids.code(ex.job)) for ex in self.ledger.open_in(worker))

    def starts(self) -> int:
        """Handler starts so far, a crash job's starts after its first left out."""
        runs = self.ledger.executions
        if not self.active:
            return len(runs)
        for row in range(self._seen, len(runs)):
            code = runs.jobs[row]
            if self.crashes(code):
                if code in self._started:
                    self._again += 1
                self._started.add(code)
        self._seen = len(runs)
        return len(runs) - self._again

    def busy(self, alive: Iterable[WorkerProcess]) -> bool:
        """Is a live worker inside a handler? Not inside a crash job whose process is gone."""
        if not self.active:  # the drain's every tick: the ledger's last open execution of each, no more
            return any(self.ledger.inside(w.name) for w in alive)
        return any(
            not (self.crashes(jobids.code(ex.job)) and not _running(w, ex.pid))
            for w in alive
            for ex in self.ledger.open_in(w.name)
        )


def _running(w: WorkerProcess, pid: int) -> bool:
    """Is the process the worker's ledger calls `pid` alive? On a host (crashbench.faults.hosts) the
    ledger's pids are the host's PID namespace's: the worker or its child by that pid (pidns.outer)."""
    own = pidns.own_pid(w.pid)
    if own is None or own == w.pid:
        return _alive(pid)
    return pidns.outer(w.pid, pid) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
