"""The task a library worker runs (`crashbench.designs.handler.handle`): the same handler as crashbench's own
worker loop, writing the same ledger. Library adapters enqueue it by this dotted name.

It runs in whatever process the library chooses (RQ forks a work horse per job, Celery a pool
process), so it finds its ledger file and workload through the environment the worker set, and
opens the file once per process. It may run in several threads of one process at once (Dramatiq's
worker threads, arq's max_jobs through asyncio.to_thread): each record carries the writing thread,
so the handler writes its own records itself, in the thread that runs it.
"""

from __future__ import annotations

import os
import time

from crashbench.model.ledger import LedgerWriter
from crashbench.model.workload import Workload

_opened: tuple[int, LedgerWriter, Workload] | None = None


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
    ledger.start(job_id, time.monotonic())
    time.sleep(workload.duration_s(job_id))
    if workload.fails(job_id, attempt):
        ledger.fail(job_id, time.monotonic())
        raise JobFailed(f"job {job_id} fails on attempt {attempt}, as the workload says")
    ledger.end(job_id, time.monotonic())
