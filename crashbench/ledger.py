"""The execution ledger: what every worker actually ran, kept where no queue design can touch it.

Each worker appends to its own file in the run directory with one write(2) per record, so a record
is either whole or absent when the worker is SIGKILLed, and it survives the kill (the kernel has it).
Records, one per line, times on the harness clock (time.monotonic()):

    R <t>            the worker is ready (the READY handshake)
    S <job> <t> <pid>  the handler of <job> starts in process <pid> (the start marker: the worker is
                     inside a handler; the pid says which process of its tree runs it)
    E <job> <t>      the handler of <job> ended, written before the ack
    F <job> <t>      the handler of <job> raised (the job failed), written before the design's fail

The runner tails all files as the run goes (`Ledger.poll`), which gives live progress, tells the
fault scheduler which worker is inside a handler, and in the end every execution of every job.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO


class LedgerWriter:
    """Worker side. Unbuffered on purpose: a buffered record would die with the worker."""

    def __init__(self, path: Path | str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.pid = os.getpid()

    def ready(self, now: float) -> None:
        os.write(self.fd, b"R %.6f\n" % now)

    def start(self, job_id: str, now: float) -> None:
        os.write(self.fd, b"S %s %.6f %d\n" % (job_id.encode(), now, self.pid))

    def end(self, job_id: str, now: float) -> None:
        os.write(self.fd, b"E %s %.6f\n" % (job_id.encode(), now))

    def end_and_start(self, job_id: str, now: float, next_job: str) -> None:
        """The end of one job and the start of the next of the same batch, in one write: the same two
        records at the same instant, for half the system calls on the batch path."""
        os.write(self.fd, b"E %s %.6f\nS %s %.6f %d\n" % (job_id.encode(), now, next_job.encode(), now, self.pid))

    def fail(self, job_id: str, now: float) -> None:
        os.write(self.fd, b"F %s %.6f\n" % (job_id.encode(), now))

    def close(self) -> None:
        os.close(self.fd)


@dataclass(slots=True)
class Execution:
    job: str
    worker: str
    start: float
    end: float | None = None  # None: the handler never finished (the worker died inside it)
    failed: bool = False  # the handler raised; `end` is when
    pid: int = 0  # the process that ran the handler

    @property
    def completed(self) -> bool:
        return self.end is not None and not self.failed


@dataclass(slots=True)
class _Tail:
    path: Path
    file: BinaryIO | None = None  # kept open: the runner polls every few milliseconds
    rest: bytes = b""
    ready_at: float | None = None
    open: Execution | None = None  # the execution this worker is inside right now


@dataclass
class Ledger:
    """Runner side: tails every worker's file and keeps every execution."""

    directory: Path
    executions: list[Execution] = field(default_factory=list)
    completed: Counter[str] = field(default_factory=Counter)
    _tails: dict[str, _Tail] = field(default_factory=dict)

    def path_for(self, worker: str) -> Path:
        path = self.directory / f"{worker}.ledger"
        self._tails.setdefault(worker, _Tail(path))
        return path

    def poll(self, worker: str | None = None) -> None:
        """Read what was appended since the last poll (of one worker, or of all)."""
        names = [worker] if worker is not None else list(self._tails)
        for name in names:
            tail = self._tails[name]
            if tail.file is None:
                try:
                    tail.file = open(tail.path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
                except FileNotFoundError:
                    continue  # the worker has not created it yet
            chunk = tail.file.read()
            if not chunk:
                continue
            data = tail.rest + chunk
            lines = data.split(b"\n")
            tail.rest = lines.pop()  # an unfinished last line waits for the next poll
            for line in lines:
                self._apply(name, tail, line.decode())

    def _apply(self, worker: str, tail: _Tail, line: str) -> None:
        kind, *rest = line.split(" ")
        if kind == "R":
            tail.ready_at = float(rest[0])
        elif kind == "S":
            ex = Execution(rest[0], worker, float(rest[1]), pid=int(rest[2]) if len(rest) > 2 else 0)
            self.executions.append(ex)
            tail.open = ex
        elif kind in ("E", "F"):
            job, t = rest[0], float(rest[1])
            if tail.open is None or tail.open.job != job:
                # An end without its start cannot come from our writer; keep it visible, not silent.
                tail.open = Execution(job, worker, t)
                self.executions.append(tail.open)
            tail.open.end = t
            tail.open.failed = kind == "F"
            tail.open = None
            if kind == "E":
                self.completed[job] += 1

    def ready_at(self, worker: str) -> float | None:
        return self._tails[worker].ready_at

    def inside(self, worker: str) -> Execution | None:
        """The execution `worker` is inside, as of the last poll."""
        return self._tails[worker].open

    def close(self) -> None:
        for tail in self._tails.values():
            if tail.file is not None:
                tail.file.close()
                tail.file = None

    @property
    def done(self) -> int:
        return len(self.completed)
