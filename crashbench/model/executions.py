"""Every handler execution of a run, held in columns: about 37 bytes each, not an object of ~400.

A run of a million jobs has a million executions or more; as objects (a dataclass with a string,
three floats and two ints each) they were most of crashbench's memory. Here each is a row across
arrays: the job's code (crashbench.jobids), its context (worker, pid, thread: one small table, since a
worker's contexts are few), start, end and ack times (NaN: none), and one byte of flags. Counting reads
the columns; everything else reads rows as `Execution` objects, made when asked for.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from crashbench import jobids

NAN = math.nan
FAILED, EMPTY_ACK = 1, 2  # flag bits


@dataclass(slots=True)
class Execution:
    job: str
    worker: str
    start: float
    end: float | None = None  # None: the handler never finished (the worker died inside it)
    failed: bool = False  # the handler raised; `end` is when
    pid: int = 0  # the process that ran the handler
    xid: int = 0  # the thread of that process that ran it
    acked: float | None = None  # when the design's ack of it returned (crashbench's own worker only)
    empty_ack: bool = False  # ... and the queue had nothing left to acknowledge

    @property
    def completed(self) -> bool:
        return self.end is not None and not self.failed


def _opt(t: float) -> float | None:
    return None if t != t else t  # NaN is the only float unequal to itself


class Executions(Sequence[Execution]):
    """Rows of executions in the order they started (as the ledger read them)."""

    __slots__ = ("_ctx_of", "acks", "contexts", "ctx", "ends", "flags", "jobs", "starts")

    def __init__(self) -> None:
        self.jobs = array("q")  # job codes
        self.ctx = array("I")  # index into `contexts`
        self.starts = array("d")
        self.ends = array("d")  # NaN: interrupted
        self.acks = array("d")  # NaN: not acked (or a library's worker, which cannot tell)
        self.flags = bytearray()  # FAILED | EMPTY_ACK
        self.contexts: list[tuple[str, int, int]] = []  # (worker, pid, thread)
        self._ctx_of: dict[tuple[str, int, int], int] = {}

    @classmethod
    def of(cls, rows: Iterable[Execution]) -> Executions:
        """Columns of these executions (a list a test made, a timeline read back); as is if they are."""
        if isinstance(rows, Executions):
            return rows
        out = cls()
        for ex in rows:
            out.add(ex)
        return out

    def context(self, worker: str, pid: int, xid: int) -> int:
        key = (worker, pid, xid)
        found = self._ctx_of.get(key)
        if found is None:
            found = self._ctx_of[key] = len(self.contexts)
            self.contexts.append(key)
        return found

    def append(self, job: str, ctx: int, start: float) -> int:
        """A started execution; its row."""
        self.jobs.append(jobids.code(job))
        self.ctx.append(ctx)
        self.starts.append(start)
        self.ends.append(NAN)
        self.acks.append(NAN)
        self.flags.append(0)
        return len(self.starts) - 1

    def add(self, ex: Execution) -> int:
        row = self.append(ex.job, self.context(ex.worker, ex.pid, ex.xid), ex.start)
        if ex.end is not None:
            self.ends[row] = ex.end
        if ex.acked is not None:
            self.acks[row] = ex.acked
        self.flags[row] = (FAILED if ex.failed else 0) | (EMPTY_ACK if ex.empty_ack else 0)
        return row

    def job(self, row: int) -> str:
        return jobids.name(self.jobs[row])

    def worker(self, row: int) -> str:
        return self.contexts[self.ctx[row]][0]

    def pid(self, row: int) -> int:
        return self.contexts[self.ctx[row]][1]

    def rebase(self, t0: float) -> None:
        """Every time as seconds since `t0`, rounded to the microsecond (the timeline's clock), in place."""
        for col in (self.starts, self.ends, self.acks):
            col[:] = array("d", (round(t - t0, 6) for t in col))

    def row(self, i: int) -> Execution:
        worker, pid, xid = self.contexts[self.ctx[i]]
        flags = self.flags[i]
        return Execution(
            jobids.name(self.jobs[i]), worker, self.starts[i], _opt(self.ends[i]), bool(flags & FAILED),
            pid, xid, _opt(self.acks[i]), bool(flags & EMPTY_ACK),
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> Execution: ...
    @overload
    def __getitem__(self, i: slice) -> list[Execution]: ...
    def __getitem__(self, i: int | slice) -> Execution | list[Execution]:
        if isinstance(i, slice):
            return [self.row(r) for r in range(len(self))[i]]
        return self.row(range(len(self))[i])

    def __iter__(self) -> Iterator[Execution]:
        contexts, name, opt = self.contexts, jobids.name, _opt
        for job, ctx, start, end, acked, flags in zip(
            self.jobs, self.ctx, self.starts, self.ends, self.acks, self.flags, strict=True
        ):
            worker, pid, xid = contexts[ctx]
            yield Execution(
                name(job), worker, start, opt(end), bool(flags & FAILED), pid, xid, opt(acked), bool(flags & EMPTY_ACK)
            )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment] - mutable

    def __repr__(self) -> str:
        return f"Executions({len(self)} rows)"
