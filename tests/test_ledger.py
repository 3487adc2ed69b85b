"""Pure unit tests of the ledger, writer and parser, on temporary files: no server, no worker."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from crashbench.model import ledger as ledger_module
from crashbench.model.ledger import Ledger, LedgerWriter


def ledger_with(tmp_path: Path, *workers: str) -> Ledger:
    ledger = Ledger(tmp_path)
    for w in workers:
        ledger.path_for(w)
    return ledger


def append(path: Path, text: str) -> None:
    with path.open("ab") as f:
        f.write(text.encode())


def kinds(ledger: Ledger) -> list[str]:
    return [p.kind for p in ledger.problems]


class Handler(threading.Thread):
    """A thread that writes records when told to, so the test decides how two threads interleave."""

    def __init__(self, writer: LedgerWriter) -> None:
        super().__init__(daemon=True)
        self.writer = writer
        self.todo: queue.Queue[Callable[[LedgerWriter], None] | None] = queue.Queue()
        self.did = threading.Semaphore(0)
        self.start()

    def run(self) -> None:
        while (step := self.todo.get()) is not None:
            step(self.writer)
            self.did.release()

    def do(self, step: Callable[[LedgerWriter], None]) -> None:
        self.todo.put(step)
        assert self.did.acquire(timeout=5)

    def stop(self) -> None:
        self.todo.put(None)
        self.join(5)


def test_two_threads_interleaved_in_one_file_are_paired_exactly(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0")
    writer = LedgerWriter(ledger.path_for("w0"))
    writer.ready(0.5)
    a, b = Handler(writer), Handler(writer)
    a.do(lambda w: w.start("a", 1.0))
    b.do(lambda w: w.start("b", 1.1))
    # Each end names the job whose start is not the file's last one: a per-file pairing gets both wrong.
    a.do(lambda w: w.end("a", 1.2))
    ledger.poll()
    assert [ex.job for ex in ledger.open_in("w0")] == ["b"]
    a.do(lambda w: w.start("a2", 1.3))
    b.do(lambda w: w.fail("b", 1.4))
    a.do(lambda w: w.end_and_start("a2", 1.5, "a3"))
    b.do(lambda w: w.start("b2", 1.6))  # b dies inside b2, a inside a3
    a.stop()
    b.stop()
    writer.close()
    ledger.poll()

    runs = {ex.job: ex for ex in ledger.executions}
    assert list(runs) == ["a", "b", "a2", "a3", "b2"]
    assert (runs["a"].start, runs["a"].end, runs["a"].failed) == (1.0, 1.2, False)
    assert (runs["b"].start, runs["b"].end, runs["b"].failed) == (1.1, 1.4, True)
    assert (runs["a2"].start, runs["a2"].end) == (1.3, 1.5)
    assert ledger.completed == {"a": 1, "a2": 1}
    assert sum(ex.end is None for ex in ledger.executions) == 2  # interrupted: a3 and b2
    assert {runs[j].xid for j in ("a", "a2", "a3")} == {a.ident}
    assert {runs[j].xid for j in ("b", "b2")} == {b.ident}
    assert {ex.pid for ex in ledger.executions} == {os.getpid()}
    assert [ex.job for ex in ledger.open_in("w0")] == ["a3", "b2"]
    assert ledger.inside("w0") == runs["b2"]  # the most recently started
    assert ledger.problems == []
    assert ledger.ready_at("w0") == 0.5


def test_two_processes_in_one_file_are_paired_by_pid(tmp_path: Path) -> None:
    """A forked child inherits the writer and its thread id; only the pid tells the two apart."""
    ledger = ledger_with(tmp_path, "w0")
    writer = LedgerWriter(ledger.path_for("w0"))
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    writer.start("a", 1.0)
    pid = os.fork()
    if pid == 0:
        try:
            writer.start("b", 1.1)
            os.write(to_parent_w, b"x")
            os.read(to_child_r, 1)
            writer.fail("b", 1.3)
        finally:
            os._exit(0)
    assert os.read(to_parent_r, 1) == b"x"
    writer.end("a", 1.2)  # while the child is inside b
    os.write(to_child_w, b"x")
    assert os.waitpid(pid, 0)[1] == 0
    writer.close()
    ledger.finish()

    runs = {ex.job: ex for ex in ledger.executions}
    assert (runs["a"].pid, runs["a"].end, runs["a"].failed) == (os.getpid(), 1.2, False)
    assert (runs["b"].pid, runs["b"].end, runs["b"].failed) == (pid, 1.3, True)
    assert runs["a"].xid == runs["b"].xid == threading.get_ident()
    assert ledger.completed == {"a": 1}
    assert ledger.problems == []


def test_a_torn_last_line_waits_while_polling_and_is_reported_by_finish(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0", "w1")
    path = ledger.path_for("w0")
    append(path, "R 0.5\nS a 1.0 7 9\nE a 1.")  # the end is still being written
    ledger.poll()
    assert ledger.inside("w0") is not None and ledger.problems == []
    append(path, "5 7 9\nS b 2.0 7 9\nE b 2.")  # the first end completes; the second is cut for good
    append(ledger.path_for("w1"), "R 0.5\n")
    ledger.finish()

    assert ledger.completed == {"a": 1}
    assert [(ex.job, ex.end) for ex in ledger.executions] == [("a", 1.5), ("b", None)]
    assert [(p.kind, p.worker, p.job) for p in ledger.problems] == [("torn", "w0", None)]
    assert "E b 2." in ledger.problems[0].detail


def test_an_end_without_its_start_is_reported_not_counted(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0")
    append(
        ledger.path_for("w0"),
        "E a 1.0 7 9\n"  # nothing open at all
        "S b 2.0 7 9\n"
        "E b 2.5 7 8\n"  # another thread: b is not open there
        "F c 2.6 7 9\n"  # the right context, the wrong job: b stays open
        "E b 3.0 7 9\n",
    )
    ledger.finish()

    assert [(ex.job, ex.start, ex.end) for ex in ledger.executions] == [("b", 2.0, 3.0)]
    assert ledger.completed == {"b": 1}
    assert [(p.kind, p.job) for p in ledger.problems] == [("orphan_end", "a"), ("orphan_end", "b"), ("orphan_end", "c")]


def test_a_start_over_an_open_execution_is_reported_and_leaves_it_interrupted(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0")
    append(ledger.path_for("w0"), "S a 1.0 7 9\nS b 2.0 7 9\nE b 3.0 7 9\n")
    ledger.finish()

    assert [(ex.job, ex.end) for ex in ledger.executions] == [("a", None), ("b", 3.0)]
    assert ledger.completed == {"b": 1}
    assert [(p.kind, p.worker, p.job) for p in ledger.problems] == [("double_open", "w0", "b")]
    assert ledger.open_in("w0") == []  # a stays interrupted: no later record can close it


@pytest.mark.parametrize(
    "line",
    [
        "X a 1.0 7 9",  # unknown kind
        "S a 1.0 7",  # an old-format start: too few fields
        "E a 1.0",  # an old-format end
        "S a b 1.0 7 9",  # a space in the job id
        "S a one 7 9",
        "S a 1.0 7.5 9",
        "E a 1.0 7 nine",
        "S  1.0 7 9",  # an empty job id
        "R",
        "R soon",
        "",
    ],
)
def test_a_malformed_line_is_reported_and_skipped(tmp_path: Path, line: str) -> None:
    ledger = ledger_with(tmp_path, "w0")
    append(ledger.path_for("w0"), f"S a 0.5 7 9\n{line}\nE a 1.5 7 9\n")
    ledger.poll()

    assert [(p.kind, p.worker, p.job) for p in ledger.problems] == [("malformed", "w0", None)]
    assert repr(line) in ledger.problems[0].detail
    assert [(ex.job, ex.end) for ex in ledger.executions] == [("a", 1.5)]
    assert ledger.completed == {"a": 1}


@pytest.mark.parametrize("job_id", ["", "a b", " a", "a\tb", "a\n", "a\nE b 1.0 1 1", "a\rb", "a\u2028b"])
def test_the_writer_refuses_a_job_id_that_would_break_the_record(tmp_path: Path, job_id: str) -> None:
    path = tmp_path / "w0.ledger"
    writer = LedgerWriter(path)
    calls: list[Callable[[], None]] = [
        lambda: writer.start(job_id, 1.0),
        lambda: writer.end(job_id, 1.0),
        lambda: writer.fail(job_id, 1.0),
        lambda: writer.end_and_start("ok", 1.0, job_id),  # not even the valid half is written
        lambda: writer.end_and_start(job_id, 1.0, "ok"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="ledger records are space-separated") as refused:
            call()
        assert repr(job_id) in str(refused.value) and "\n" not in str(refused.value)
    writer.close()
    assert path.read_bytes() == b""


def test_the_writer_writes_one_whole_record_per_call(tmp_path: Path) -> None:
    path = tmp_path / "w0.ledger"
    writer = LedgerWriter(path)
    writer.ready(0.25)
    writer.start("ä-1", 1.0, xid=42)
    writer.end_and_start("ä-1", 2.0, "b", xid=42)
    writer.close()
    assert path.read_text() == (
        f"R 0.250000\nS ä-1 1.000000 {os.getpid()} 42\nE ä-1 2.000000 {os.getpid()} 42\nS b 2.000000 {os.getpid()} 42\n"
    )


def test_an_abandoned_process_no_longer_makes_its_worker_look_busy(tmp_path: Path) -> None:
    """A child killed alone (kill_target child): its execution stays interrupted, the worker idle, and
    a later child that reuses the pid (same thread id after a fork) is no double open."""
    ledger = ledger_with(tmp_path, "w0")
    path = tmp_path / "w0.ledger"
    append(path, "S a 1.0 42 7\n")
    ledger.poll()
    assert ledger.inside("w0") is not None
    ledger.abandon("w0", 42)
    assert ledger.inside("w0") is None and ledger.open_in("w0") == []
    append(path, "S b 2.0 42 7\nE b 3.0 42 7\n")
    ledger.poll()
    assert kinds(ledger) == []
    assert [(e.job, e.end) for e in ledger.executions] == [("a", None), ("b", 3.0)]


def test_a_poll_after_finish_reads_nothing_twice(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0")
    append(tmp_path / "w0.ledger", "S a 1.0 42 7\nE a 2.0 42 7\n")
    ledger.finish()
    ledger.poll()
    assert len(ledger.executions) == 1 and ledger.completed["a"] == 1


def test_an_ack_names_an_execution_its_context_completed_and_an_orphan_one_is_reported(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0")
    LedgerWriter(ledger.path_for("w0")).acked(["z"], 0.5, xid=9)  # the writer's own format: nothing ended yet
    append(
        ledger.path_for("w0"),
        "S a 1.0 7 9\nE a 1.5 7 9\nS b 1.5 7 9\nE b 1.8 7 9\n"  # a batch of two, acked together after it
        "A b 1.9 7 8\n"  # another thread: reported
        "A a 2.0 7 9\nA b 2.0 7 9\n"
        "A b 2.1 7 9\n"  # b again: reported
        "S c 2.2 7 9\nF c 2.3 7 9\nA c 2.4 7 9\n",  # a failed execution is not acked: reported
    )
    ledger.finish()

    assert [(ex.job, ex.acked) for ex in ledger.executions] == [("a", 2.0), ("b", 2.0), ("c", None)]
    assert [(p.kind, p.job) for p in ledger.problems] == [("orphan_ack", j) for j in ("z", "b", "b", "c")]


def test_an_empty_ack_is_an_n_record_and_a_batch_s_answers_go_with_their_jobs(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, "w0")
    writer = LedgerWriter(ledger.path_for("w0"))
    writer.start("a", 1.0, xid=9)
    writer.end_and_start("a", 1.5, "b", xid=9)
    writer.end_and_start("b", 1.8, "c", xid=9)
    writer.end("c", 1.9, xid=9)
    writer.acked(["a", "b", "c"], 2.0, [True, False, None], xid=9)  # held, nothing left, cannot tell
    ledger.finish()

    assert [(ex.job, ex.acked, ex.empty_ack) for ex in ledger.executions] == [
        ("a", 2.0, False), ("b", 2.0, True), ("c", 2.0, False),
    ]  # fmt: skip
    assert ledger.problems == []


def test_a_worker_far_ahead_of_the_polls_is_read_in_bounded_pieces_and_nothing_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One poll reads a worker's file READ_MAX bytes at a time (so a backlog of records never becomes
    a line object each at once), a record cut between two reads included."""
    monkeypatch.setattr(ledger_module, "READ_MAX", 50)
    ledger = ledger_with(tmp_path, "w0")
    append(tmp_path / "w0.ledger", "".join(f"S {i:06d} {i}.0 1 2\nE {i:06d} {i}.5 1 2\n" for i in range(100)))
    reads = []
    read = Ledger._read
    monkeypatch.setattr(Ledger, "_read", lambda self, *a: reads.append(n := read(self, *a)) or n)
    ledger.poll()
    assert ledger.done == 100 and len(ledger.executions) == 100 and not ledger.problems
    assert [(ex.job, ex.end) for ex in ledger.executions][-1] == ("000099", 99.5)
    assert len(reads) > 50 and max(reads) == 50
