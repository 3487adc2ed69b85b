"""The task a library worker runs (`crashbench.designs.handler.handle`): the same handler as crashbench's own
worker loop, writing the same ledger. Library adapters enqueue it by this dotted name.

It runs in whatever process the library chooses (RQ forks a work horse per job, Celery a pool
process), so it finds its ledger file and workload through the environment the worker set, and
opens the file once per process. It may run in several threads of one process at once (Dramatiq's
worker threads, arq's max_jobs through asyncio.to_thread): each record carries the writing thread,
so the handler writes its own records itself, in the thread that runs it.

A crash job (workload.crash_rate) kills the process that runs it on every attempt, after its start
record and its duration (`crash`): the ledger keeps its execution open (interrupted), as a SIGKILL's.
"""

from __future__ import annotations

import mmap
import os
import signal

from crashbench.control import memlimit
from crashbench.model import hostclock
from crashbench.model.ledger import LedgerWriter
from crashbench.model.workload import Workload, spend

_opened: tuple[int, LedgerWriter, Workload] | None = None


CRASH_EXIT = 70  # the exit code of a crash job that dies by os._exit (crash_how = "exit")
CHUNK = 16 * 2**20  # bytes a memory crash allocates at a time


def crash(how: str) -> None:
    """End this process as a crash job does, never returning: SIGKILL to itself ("sigkill"),
    os._exit(CRASH_EXIT) ("exit"), or allocate until the worker's memory limit stops it ("memory",
    crashbench.control.memlimit): under a cgroup (v2 or v1) every page is touched and the kernel's OOM
    killer SIGKILLs the process; under RLIMIT_AS the address space runs out (MemoryError), and the process ends with
    os._exit(OOM_EXIT), as the OOM killer would have ended it. With no limit at all, it stops
    allocating at twice the headroom and exits the same way, rather than take the machine's memory."""
    if how == "exit":
        os._exit(CRASH_EXIT)
    if how == "memory":
        touch = os.environ.get(memlimit.ENV) in memlimit.CGROUPS  # v2's or v1's: the OOM killer ends it
        held: list[mmap.mmap] = []
        try:
            while len(held) * CHUNK < 2 * memlimit.HEADROOM:
                chunk = mmap.mmap(-1, CHUNK)
                if touch:  # RSS, which memory.max counts; the address space alone is what RLIMIT_AS counts
                    chunk.write(b"\x01" * CHUNK)
                held.append(chunk)
        except (MemoryError, OSError):
            pass
        os._exit(memlimit.OOM_EXIT)
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(CRASH_EXIT)  # not reached: SIGKILL cannot be caught


class JobFailed(Exception):
    """The workload says this attempt of the job fails."""


def context() -> tuple[LedgerWriter, Workload]:
    global _opened
    # No lock: two threads racing here open the file twice, and both writers append whole records
    # all the same; a lock held by another thread at fork time would hang the forked child instead.
    if _opened is None or _opened[0] != os.getpid():
        _opened = (
            os.getpid(),
            LedgerWriter(os.environ["CRASHBENCH_LEDGER"]),
            Workload.from_json(os.environ["CRASHBENCH_WORKLOAD"]),
        )
    return _opened[1], _opened[2]


def handle(job_id: str, attempt: int = 1) -> None:
    ledger, workload = context()
    ledger.start(job_id, hostclock.now())
    spend(workload.duration_s(job_id), workload.job_work)
    if workload.crash_rate and workload.crashes(job_id):
        crash(workload.crash_how)
    if workload.fails(job_id, attempt):
        ledger.fail(job_id, hostclock.now())
        raise JobFailed(f"job {job_id} fails on attempt {attempt}, as the workload says")
    ledger.end(job_id, hostclock.now())
