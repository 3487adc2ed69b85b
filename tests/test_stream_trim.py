"""A stream trimmed below its backlog (queue.stream_maxlen): MAXLEN trims by position, not by
acknowledgement. The jobs trimmed before anyone read them and the pending ones whose entries were
trimmed are lost, and counted so with their ids, from the entry ids XADD answered at enqueue and the
harness's own reading of the stream at the end (crashbench.evidence.trim)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from crashbench.designs.stream import GROUP, StreamQueue
from crashbench.evidence import trim
from crashbench.jobids import JobIds
from crashbench.model.executions import Execution
from crashbench.model.faults import BrokerFaultRecord
from crashbench.model.queue import DesignSettings, Job, Located, StreamEnd
from crashbench.model.spec import Scenario
from crashbench.model.timeline import DesignFlags, Enqueue, Timeline
from crashbench.run.session import Options, run_designs
from tests.conftest import assert_recounts
from tests.test_cli import assert_clean_error, crashbench_here

TRIMMED = Scenario.of(name="trim", jobs=150, job_ms=0, workers=2, kills=0, stream_maxlen=100, drain_timeout=5)


def test_the_claim_drops_and_counts_a_pending_entry_the_stream_trimmed(client: redis.Redis) -> None:
    q = StreamQueue(client, "test:trim1:", DesignSettings(stream_maxlen=5, stale_after=0.05))
    q.setup()
    receipts = q.enqueue([Job(f"{i:06d}") for i in range(3)])
    assert receipts == [eid for eid, _ in client.xrange("test:trim1:stream")]  # XADD's replies, in order
    held = q.fetch("w1", 0.01, 0.0)
    assert held is not None and held.receipt == receipts[0]
    q.enqueue([Job(f"{i:06d}") for i in range(3, 20)])  # its entry goes while it is pending
    assert client.xlen("test:trim1:stream") == 5 and not client.xrange("test:trim1:stream", held.receipt, held.receipt)
    time.sleep(0.06)  # the server's own clock decides idleness: past stale_after
    claimed = q.fetch("w2", 0.01, 1.0)
    # Not handed out again (nothing says which job it was): w2 reads the next live entry instead.
    assert claimed is not None and claimed.id == "000015" and claimed.attempt == 1
    assert client.hget("test:trim1:stats", "trimmed") == "1"
    pel = client.xpending_range("test:trim1:stream", GROUP, min="-", max="+", count=10)
    assert [p["message_id"] for p in pel] == [claimed.receipt]
    assert q.state().held.get("000000") is None and client.hget("test:trim1:stats", "requeue_events") is None


def test_exact_and_approximate_maxlen(client: redis.Redis) -> None:
    exact = StreamQueue(client, "test:trim2:", DesignSettings(stream_maxlen=300))
    approx = StreamQueue(client, "test:trim3:", DesignSettings(stream_maxlen=300, stream_approximate=True))
    jobs = [Job(f"{i:06d}", "{}") for i in range(1050)]
    exact.enqueue(jobs)
    approx.enqueue(jobs)
    assert client.xlen("test:trim2:stream") == 300
    assert 300 < client.xlen("test:trim3:stream") < 1050  # whole nodes only: keeps more than the bound


def test_a_bound_below_the_backlog_loses_exactly_the_oldest_unread_jobs(valkey_url: str, tmp_path: Path) -> None:
    run = run_designs(TRIMMED, ["stream"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert run.problems == [] and run.timings.drained
    assert (c.done, c.lost, c.trimmed, c.trimmed_unread, c.trimmed_pending) == (100, 50, 50, 50, 0)
    assert run.jobs["lost"] == run.jobs["trimmed_unread"] == [f"{i:06d}" for i in range(50)]
    assert run.jobs["trimmed_pending"] == []
    unbounded = run_designs(TRIMMED.replace(stream_maxlen=0), ["stream"], Options(redis_url=valkey_url))
    assert (unbounded.runs[0].counts.lost, unbounded.runs[0].counts.trimmed) == (0, 0)
    assert_recounts(unbounded, tmp_path)


def test_approximate_trimming_loses_whole_nodes_of_the_oldest_unread_jobs(valkey_url: str) -> None:
    """MAXLEN ~ 300 trims whole nodes from the head, never below the bound: how many depends on the
    nodes' sizes in bytes (the entry ids' deltas, so the enqueue's timing), which no second stream
    reproduces. What the run must show: the lost are exactly the oldest jobs, each trimmed unread (its
    entry id below the stream's first at the end), and the kept ones all done."""
    sc = TRIMMED.replace(jobs=1050, stream_maxlen=300, stream_trim="approximate")
    run = run_designs(sc, ["stream"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert run.problems == [] and run.timings.drained
    assert 0 < c.lost <= 1050 - 300 and c.done == 1050 - c.lost
    assert (c.trimmed, c.trimmed_unread, c.trimmed_pending) == (c.lost, c.lost, 0)
    assert run.jobs["lost"] == run.jobs["trimmed_unread"] == [f"{i:06d}" for i in range(min(c.lost, 100))]


def test_pending_entries_trimmed_are_lost_and_named(valkey_url: str, tmp_path: Path) -> None:
    """Produced while the workers run, the backlog passes the bound: the killed worker's pending entry
    is trimmed before its claim, and every other job the workers did not reach is trimmed unread. Two
    workers of 20 ms jobs (100 a second) fall behind a producer of 400 a second, loaded or not."""
    sc = Scenario.of(
        name="trim-pending", jobs=400, job_ms=20, workers=2, kills=1, interval=0.3, produce="during", produce_s=1.0,
        stream_maxlen=50, stale_after=0.3, recover_every=0.05, drain_timeout=5,
    )  # fmt: skip
    result = run_designs(sc, ["stream"], Options(redis_url=valkey_url))
    run = result.runs[0]
    c = run.counts
    assert run.problems == [] and run.timings.drained
    assert (c.kills_mid_job, c.trimmed_pending, c.requeue_events, c.unrecovered) == (1, 1, 0, 1)
    assert run.jobs["trimmed_pending"] == [run.kills[0].job]
    assert c.lost == c.trimmed == c.trimmed_unread + 1 and c.trimmed_unread > 0
    assert c.done + c.lost == 400 and c.duplicated == 0
    assert_recounts(result, tmp_path)


def _timeline(gone: list[str]) -> Timeline:
    tl = Timeline(0, "stream", "", "p:", 0, Scenario().to_dict(), DesignFlags(), 0.0, 0.0, 1.0)
    tl.enqueues = [Enqueue(0.0, JobIds.of(["000000", "000001", "000002", "000003", "000004"]),
                           entries=("1-0", "1-1", "1-2", "1-3", "9-0"))]  # fmt: skip
    tl.located = Located(streams={"stream": StreamEnd("2-0", "5-0", 3, gone)})
    return tl


def test_what_the_trim_classes_take_as_evidence() -> None:
    lost = {"000000", "000001", "000002", "000003", "000004"}
    tl = _timeline(gone=["1-3"])
    tl.executions = [
        Execution("000001", "w1", 0.1),  # started, never ended: it was pending
        Execution("000002", "w1", 0.2, 0.3, failed=True),  # raised: its retry was an entry no receipt names
    ]
    got = trim.trimmed(tl, lost)
    assert got is not None
    # 000003: no start, but the harness's final PEL reading lists its entry, data gone. 000004's receipt
    # is past the stream's last generated id: not an entry it ever held, so not counted trimmed.
    assert (got.unread, got.pending) == ({"000000"}, {"000001", "000003"})
    assert trim.trimmed(tl, {"000000"}) == trim.Trimmed({"000000"}, set())  # only lost jobs are classified
    tl.located.streams["stream"] = StreamEnd("1-1", "5-0", 3)  # 1-1 still there: only 1-0 was trimmed
    assert trim.trimmed(tl, lost) == trim.Trimmed({"000000"}, set())
    tl.broker_fault = BrokerFaultRecord("kill", "none", 0.5, 0, [], 0)
    assert trim.trimmed(tl, lost) is None  # the server may have lost the entries itself: no proof of a trim
    tl.broker_fault = None
    tl.enqueues = [dataclasses.replace(e, entries=None) for e in tl.enqueues]
    assert trim.trimmed(tl, lost) is None  # no receipts (a timeline from before them): no classes at all


def test_bad_trim_settings_are_refused_in_one_line(tmp_path: Path) -> None:
    nowhere = ["--server", "/nonexistent/redis-server"]
    assert_clean_error(
        crashbench_here("run", "--stream-trim", "sideways", *nowhere, tmp_path=tmp_path), 2, "stream-trim"
    )
    assert_clean_error(
        crashbench_here("run", "--stream-maxlen", "-1", *nowhere, tmp_path=tmp_path), 2, "queue.stream_maxlen"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text('[queue]\nstream_trim = "roughly"\n[workload]\nproduce = "after"\n')
    cp = crashbench_here("run", "--scenario", str(bad), *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "queue.stream_trim must be one of exact, approximate", "workload.produce must be one of")


def test_the_readme_trimming_tables_are_what_their_result_files_give() -> None:
    """The three trimming tables of docs/findings/stream-trimming.md are lab/stream_trim.py's rendering of
    results/readme/stream-trim (make stream-trim); the result files recount like every README result
    (tests/test_counts.py)."""
    root = Path(__file__).resolve().parent.parent
    script, results = root / "lab" / "stream_trim.py", root / "results" / "readme" / "stream-trim"
    table = subprocess.run(
        [sys.executable, str(script), "table", str(results)], capture_output=True, text=True, check=True
    ).stdout
    rows = [row for row in table.splitlines() if row.startswith("|")]
    readme = (root / "docs" / "findings" / "stream-trimming.md").read_text()
    assert len(rows) == 7 + 8 + 6 and all(row in readme for row in rows)
    assert "| 250 | 0.125x | 250 | 1,750 | 1,750 | 300 | 1,700 | 1,700 | 0 |" in rows


def test_an_enqueue_that_returns_anything_but_one_receipt_per_job_is_refused() -> None:
    from crashbench.errors import RunAborted
    from crashbench.model.queue import receipts

    assert receipts(None, ["a", "b"], "d") is None
    assert receipts(["1-0", "2-0"], ["a", "b"], "d") == ("1-0", "2-0")
    for wrong in (["1-0"], ["1-0", 2], 3, "1-0"):
        with pytest.raises(RunAborted, match="d: enqueue must return None or one receipt string per job"):
            receipts(wrong, ["a", "b"], "d")
