"""The worker: the body of every forked worker process.

Fetch a job, mark the start in the ledger, run the handler, mark the end, ack. Signal handlers
only set a flag; the loop notices it between jobs (a graceful stop finishes the current job).
A worker also stops on its own when the runner is gone (its parent pid changes).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import redis

from crashbench.designs import Design, DesignSettings
from crashbench.ledger import LedgerWriter


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs; inherited through fork, so nothing is serialized."""

    redis_url: str
    design: type[Design]
    prefix: str
    settings: DesignSettings
    job_ms: float
    fetch_timeout: float = 0.1  # also bounds how late a worker notices a stop request


def run_worker(spec: WorkerSpec, name: str, ledger_path: Path, parent_pid: int) -> int:
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    clock = time.monotonic
    client = redis.Redis.from_url(spec.redis_url, decode_responses=True)
    design = spec.design(client, spec.prefix, spec.settings)
    ledger = LedgerWriter(ledger_path)
    design.start_worker(name, clock())
    ledger.ready(clock())

    job_seconds = spec.job_ms / 1000
    while not stopping and os.getppid() == parent_pid:
        job = design.fetch(name, spec.fetch_timeout, clock())
        if job is None:
            continue
        ledger.start(job.id, clock())
        if job_seconds:
            time.sleep(job_seconds)  # the handler: job_ms of "work"; the ledger's end record is its side effect
        ledger.end(job.id, clock())
        design.ack(name, job, clock())
    ledger.close()
    client.close()
    return 0
