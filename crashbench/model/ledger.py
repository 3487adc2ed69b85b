"""The execution ledger: what every worker actually ran, kept where no queue design can touch it.

Each worker appends to its own file in the run directory with one write(2) per record, so a record
is either whole or absent when the worker is SIGKILLed, and it survives the kill (the kernel has it).
Records, one per line, fields separated by one space, times on the harness clock (time.monotonic()):

    R <t>                     the worker is ready (the READY handshake)
    S <job> <t> <pid> <xid>   the handler of <job> starts
    E <job> <t> <pid> <xid>   the handler of <job> ended, written before the ack
    F <job> <t> <pid> <xid>   the handler of <job> raised (the job failed), written before the design's fail
    A <job> <t> <pid> <xid>   the design acknowledged <job> after that context's last end (crashbench's
                              own worker writes it once the ack returned; a library's cannot tell)
    N <job> <t> <pid> <xid>   ... the ack returned, and the queue had nothing left to acknowledge (an
                              empty ack: recovery, or another worker's late ack, got there first)

<pid> is the writing process and <xid> its writing thread (threading.get_ident()): together they
name one execution context. One worker file can hold several handlers at once (library workers with
threads or pool processes, arq's max_jobs), so an end is paired with the start of the same context,
never merely with the last start in the file.

The runner tails all files as the run goes (`Ledger.poll`), which gives live progress, tells the
fault scheduler which worker is inside a handler, and in the end every execution of every job.
What does not fit (an end without its start, a start over an open one, an ack of no completed
execution, a bad or cut line) is kept
in `Ledger.problems`: evidence about the harness, never silently absorbed into the counts.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from threading import get_ident
from typing import BinaryIO

from crashbench import jobids
from crashbench.model.executions import EMPTY_ACK, FAILED, Execution, Executions

__all__ = ["Execution", "Executions", "Ledger", "LedgerProblem", "LedgerWriter"]

# The pid is read on every record, and os.getpid() is a system call; a writer inherited through
# fork (a library forking its work horse) must still write the child's pid, hence the hook.
_pid = os.getpid()


READ_MAX = 256 * 1024  # bytes of one worker's file read at once: ~6,000 records
ACKABLE = 1024  # completed executions per context that an ack may still name (more than any batch)


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


def _refuse(job_id: str) -> ValueError:
    """For a job id that is empty, or has a space or a character str.isprintable() rejects (all other
    whitespace, control characters): such a record would not parse. The check is inlined in each
    writer method, without a regex, because it runs on every record."""
    why = "is empty" if not job_id else "contains whitespace or a control character"
    return ValueError(f"job id {job_id!r} {why}: ledger records are space-separated, one per line")


class LedgerWriter:
    """Worker side. Unbuffered on purpose: a buffered record would die with the worker.

    `xid` defaults to the calling thread, which is right whenever the handler writes its own records.
    Each method is one whole record (or two) in one os.write, spelled out rather than shared through
    a helper: this is every handler's hot path."""

    def __init__(self, path: Path | str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def ready(self, now: float) -> None:
        os.write(self.fd, b"R %.6f\n" % now)

    def start(self, job_id: str, now: float, xid: int | None = None) -> None:
        if not job_id or " " in job_id or not job_id.isprintable():
            raise _refuse(job_id)
        os.write(self.fd, b"S %s %.6f %d %d\n" % (job_id.encode(), now, _pid, get_ident() if xid is None else xid))

    def end(self, job_id: str, now: float, xid: int | None = None) -> None:
        if not job_id or " " in job_id or not job_id.isprintable():
            raise _refuse(job_id)
        os.write(self.fd, b"E %s %.6f %d %d\n" % (job_id.encode(), now, _pid, get_ident() if xid is None else xid))

    def end_and_start(self, job_id: str, now: float, next_job: str, xid: int | None = None) -> None:
        """The end of one job and the start of the next of the same batch, in one write: the same two
        records at the same instant, for half the system calls on the batch path."""
        for job in (job_id, next_job):
            if not job or " " in job or not job.isprintable():
                raise _refuse(job)
        ctx = b"%d %d" % (_pid, get_ident() if xid is None else xid)
        os.write(self.fd, b"E %s %.6f %s\nS %s %.6f %s\n" % (job_id.encode(), now, ctx, next_job.encode(), now, ctx))

    def acked(
        self, job_ids: list[str], now: float, held: list[bool | None] | None = None, xid: int | None = None
    ) -> None:
        """The acks of a fetch's finished jobs (one, or a batch acked at once), in one write. `held`:
        per job, the design's answer (False: an empty ack, N; True or None: A)."""
        for job in job_ids:
            if not job or " " in job or not job.isprintable():
                raise _refuse(job)
        ctx = b"%d %d" % (_pid, get_ident() if xid is None else xid)
        kinds = [b"N" if h is False else b"A" for h in held] if held and len(held) == len(job_ids) else None
        os.write(
            self.fd,
            b"".join(b"%s %s %.6f %s\n" % (kinds[i] if kinds else b"A", job.encode(), now, ctx)
                     for i, job in enumerate(job_ids)),
        )  # fmt: skip

    def fail(self, job_id: str, now: float, xid: int | None = None) -> None:
        if not job_id or " " in job_id or not job_id.isprintable():
            raise _refuse(job_id)
        os.write(self.fd, b"F %s %.6f %d %d\n" % (job_id.encode(), now, _pid, get_ident() if xid is None else xid))

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class LedgerProblem:
    """A record (or the lack of one) that does not fit: `kind` is orphan_end, orphan_ack, double_open,
    malformed or torn; `job` when the record names one."""

    kind: str
    worker: str
    job: str | None
    detail: str


@dataclass(slots=True)
class _Tail:
    path: Path
    file: BinaryIO | None = None  # kept open: the runner polls every few milliseconds
    rest: bytes = b""  # an unfinished last line
    ready_at: float | None = None
    # The executions (rows) this worker is inside right now, by "<pid> <xid>", in the order they started.
    opens: dict[str, int] = field(default_factory=dict)
    # Per context, the executions it completed and has not acked yet, by job (a batch is acked after
    # its last job ends); bounded, since a library's worker never writes an ack.
    unacked: dict[str, dict[str, int]] = field(default_factory=dict)
    contexts: dict[str, int] = field(default_factory=dict)  # "<pid> <xid>" -> its context in the columns


@dataclass
class Ledger:
    """Runner side: tails every worker's file and keeps every execution."""

    directory: Path
    executions: Executions = field(default_factory=Executions)
    problems: list[LedgerProblem] = field(default_factory=list)
    done: int = 0  # jobs completed at least once (the progress line's figure)
    _done: jobids.Marks = field(default_factory=jobids.Marks)  # ... which: not a set of a million strings
    _tails: dict[str, _Tail] = field(default_factory=dict)
    _finished: bool = False  # after finish(), a poll would reopen the files and read them twice

    def path_for(self, worker: str) -> Path:
        """`worker`'s ledger file, read from now on."""
        path = self.path_of(worker)
        self._tails.setdefault(worker, _Tail(path))
        return path

    def path_of(self, worker: str) -> Path:
        """`worker`'s ledger file, without reading it: for the process that forks the worker."""
        return self.directory / f"{worker}.ledger"

    def poll(self, worker: str | None = None) -> None:
        """Read what was appended since the last poll (of one worker, or of all)."""
        if self._finished:
            return
        names = [worker] if worker is not None else list(self._tails)
        for name in names:
            tail = self._tails[name]
            if tail.file is None:
                try:
                    tail.file = open(tail.path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
                except FileNotFoundError:
                    continue  # the worker has not created it yet
            while self._read(name, tail) == READ_MAX:
                pass

    def _read(self, name: str, tail: _Tail) -> int:
        """One read of at most READ_MAX bytes (a worker far ahead of the runner's polls must not cost
        a line object per record of all it wrote at once); how many bytes came."""
        assert tail.file is not None
        chunk = tail.file.read(READ_MAX)
        if not chunk:
            return 0
        cut = chunk.rfind(b"\n")
        if cut < 0:
            tail.rest += chunk  # still no whole line: it waits for the next read
            return len(chunk)
        data = tail.rest + chunk[:cut] if tail.rest else chunk[:cut]
        tail.rest = chunk[cut + 1 :]
        # Decoded once per chunk, after the cut, so a character is never split; never raises.
        self._apply(name, tail, data.decode(errors="replace").split("\n"))
        return len(chunk)

    def _apply(self, worker: str, tail: _Tail, lines: list[str]) -> None:
        # The runner's hot loop (millions of records in a big run): one split per line, one dict
        # lookup per record. Executions are keyed by the raw "<pid> <xid>" text, which the writer
        # spells the same way in a start and its end, so an end converts no numbers but its time;
        # an end that matches nothing is looked at closely on that (rare) path only.
        opens, unacked, contexts, runs = tail.opens, tail.unacked, tail.contexts, self.executions
        jobs, ends, acks, flags = runs.jobs, runs.ends, runs.acks, runs.flags
        for line in lines:
            f = line.split(" ", 3)
            try:
                kind, job, t, key = f
                if not job:
                    raise ValueError("no job id")
                if kind == "S":
                    ctx = contexts.get(key)
                    if ctx is None:
                        pid, xid = key.split(" ")
                        ctx = contexts[key] = runs.context(worker, int(pid), int(xid))
                    row = runs.append(job, ctx, float(t))
                    if (earlier := opens.pop(key, None)) is not None:
                        self._problem("double_open", worker, job, f"{line!r} while {runs.job(earlier)} is open there")
                    opens[key] = row
                elif kind == "E" or kind == "F":
                    end = float(t)
                    row = opens.get(key, -1)
                    if row < 0 or jobs[row] != jobids.known(job):
                        self._orphan(worker, line, key, row)
                        continue
                    del opens[key]
                    ends[row] = end
                    if kind == "E":
                        self._completed(jobs[row])
                        waiting = unacked.setdefault(key, {})
                        waiting[job] = row
                        if len(waiting) > ACKABLE:
                            del waiting[next(iter(waiting))]
                    else:
                        flags[row] |= FAILED
                elif kind == "A" or kind == "N":
                    acked = float(t)
                    row = unacked.get(key, {}).pop(job, -1)
                    if row < 0:
                        self._problem("orphan_ack", worker, job, f"{line!r}: no completed execution of it to ack there")
                        continue
                    acks[row] = acked
                    if kind == "N":
                        flags[row] |= EMPTY_ACK
                else:
                    raise ValueError("unknown kind")
            except ValueError:
                if len(f) == 2 and f[0] == "R":
                    try:
                        tail.ready_at = float(f[1])
                        continue
                    except ValueError:
                        pass
                self._problem("malformed", worker, None, repr(line))

    def _completed(self, c: int) -> None:
        if self._done.add(c):
            self.done += 1

    def has_completed(self, job: str) -> bool:
        """Whether a handler of `job` completed, by the records read so far."""
        c = jobids.known(job)
        return c is not None and self._done.has(c)

    def abandon(self, worker: str, pid: int) -> None:
        """Process `pid` of `worker` is dead (a fault killed it while its worker lives on): its open
        executions stay interrupted for good, no longer make the worker look busy, and a later process
        that reuses the pid does not look like a double open."""
        opens = self._tails[worker].opens
        for key in [k for k, row in opens.items() if self.executions.pid(row) == pid]:
            del opens[key]

    def _orphan(self, worker: str, line: str, key: str, open_there: int) -> None:
        """An end that closes nothing (`open_there`: the row open in its context, or -1): either a bad
        context (malformed) or a real orphan end."""
        pid, xid = key.split(" ")  # a ValueError goes up as "malformed"
        int(pid), int(xid)
        job = line.split(" ", 2)[1]
        there = f"{self.executions.job(open_there)} is open there" if open_there >= 0 else "nothing is open there"
        self._problem("orphan_end", worker, job, f"{line!r} but {there}")

    def _problem(self, kind: str, worker: str, job: str | None, detail: str) -> None:
        self.problems.append(LedgerProblem(kind, worker, job, detail))

    def ready_at(self, worker: str) -> float | None:
        return self._tails[worker].ready_at

    def inside(self, worker: str) -> Execution | None:
        """One execution `worker` is inside as of the last poll (the most recently started), or None."""
        row = next(reversed(self._tails[worker].opens.values()), -1)
        return self.executions.row(row) if row >= 0 else None

    def open_in(self, worker: str) -> list[Execution]:
        """Every execution `worker` is inside as of the last poll, oldest first."""
        return [self.executions.row(row) for row in self._tails[worker].opens.values()]

    def finish(self) -> None:
        """The last poll, once no worker can write any more. A file that does not end in a newline has
        a cut last record (a short write: one write(2) per record makes it rare, not impossible, e.g.
        a full disk); it is reported, not parsed. Then the files are closed."""
        self.poll()
        for name, tail in self._tails.items():
            if tail.rest:
                self._problem("torn", name, None, f"last record cut: {tail.rest[:80]!r}")
                tail.rest = b""
        self.close()
        self._finished = True

    def hand_over(self, t0: float) -> Executions:
        """Every execution on the timeline's clock (seconds since `t0`), once the ledger was read for
        the last time: rebased in place and handed over, since a copy of a million rows would double
        the run's biggest figure."""
        runs, self.executions = self.executions, Executions()
        runs.rebase(t0)
        return runs

    def close(self) -> None:
        for tail in self._tails.values():
            if tail.file is not None:
                tail.file.close()
                tail.file = None

    @property
    def completed(self) -> Counter[str]:
        """Completions per job (for tests and small runs: a Counter of every completed job)."""
        return Counter(ex.job for ex in self.executions if ex.completed)
