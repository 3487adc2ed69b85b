"""Power loss (issue 31): the lazy file system (crashbench.control.lazyfs) and the power-loss broker
fault (crashbench.faults.power). Real FUSE mounts, real servers; root and /dev/fuse needed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import pytest

from crashbench.control import lazyfs
from crashbench.control.lazyfs import LazyFS
from crashbench.errors import UsageError
from crashbench.evidence import aof
from crashbench.evidence.checker import History, Sections
from crashbench.evidence.search import Needle
from crashbench.faults.power import cut
from crashbench.jobids import JobIds
from crashbench.model.spec import Scenario
from crashbench.model.timeline import DesignFlags, Enqueue, FaultEvent, Timeline
from crashbench.run.session import Options, run_designs

WHY = lazyfs.unavailable()
needs_fuse = pytest.mark.skipif(bool(WHY), reason=WHY or "")


def _mounts(where: str | None = None) -> list[str]:
    """This process's lazy file systems still mounted: those under `where`, else under a work directory of
    this process's (crashbench.control.workdirs names them with its pid). Another test's, running in
    another xdist worker at the same time, is not ours to count."""
    mine = where if where is not None else f"-{os.getpid()}-"
    lines = Path("/proc/mounts").read_text().splitlines()
    return [line for line in lines if lazyfs.FSNAME in line and mine in line]


def _ours(before: set[int]) -> list[str]:
    """Our processes started since `before` (the pids of this process's children then: a fixture's server
    of this xdist worker is not the test's): none may be left, not even a zombie (fusermount3's
    auto_unmount helper is one)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.pid not in before:
                out.append(f"{p.name()} ({p.status()})")
    return out


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@needs_fuse
def test_a_power_cut_keeps_what_was_fsynced_and_a_rename_carries_it(tmp_path: Path) -> None:
    backing, mount = tmp_path / "disk", tmp_path / "mount"
    backing.mkdir()
    mount.mkdir()
    (backing / "before").write_bytes(b"z" * 7)  # there at the mount: durable whole
    before = _children()
    disk = LazyFS(backing, mount)
    disk.start()
    try:
        fd = os.open(mount / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"a" * 100)
        os.fsync(fd)
        os.write(fd, b"b" * 50)  # written, never synced
        os.close(fd)
        fd = os.open(mount / "temp", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"m" * 10)
        os.fdatasync(fd)
        os.write(fd, b"n")
        os.close(fd)
        os.rename(mount / "temp", mount / "manifest")  # durable as far as it was synced, not by the rename
        (mount / "never").write_bytes(b"x" * 20)
        assert [os.path.getsize(mount / n) for n in ("log", "manifest", "never", "before")] == [150, 11, 20, 7]
        disk.power_cut()
        assert (mount / "log").read_bytes() == b"a" * 100
        assert (mount / "manifest").read_bytes() == b"m" * 10
        assert [os.path.getsize(mount / n) for n in ("never", "before")] == [0, 7]
        assert sorted(os.listdir(mount)) == ["before", "log", "manifest", "never"]  # the control file unlisted
        with open(mount / "log", "ab") as f:  # writes go on after the cut, from its length
            f.write(b"c")
        assert os.path.getsize(backing / "log") == 101
    finally:
        disk.stop()
    assert not os.path.ismount(mount) and _mounts(str(tmp_path)) == [] and _ours(before) == []


def _power_loss(persistence: str) -> Scenario:
    """A backlog at the cut: the producer enqueues 2,000 jobs a second for 0.5 s, one worker runs 500 a
    second, and the power goes at 0.45 s, during production."""
    return Scenario.of(
        name="power", jobs=1000, job_ms=2, workers=1, kills=0, fault="power-loss", fault_at=0.45, downtime=0.1,
        produce_s=0.5, persistence=persistence, drain_timeout=15,
    )  # fmt: skip


@needs_fuse
@pytest.mark.slow
def test_a_power_cut_loses_acknowledged_jobs_under_everysec_and_none_under_always(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib

    from crashbench.faults import power

    brokers = []
    real = power.power_servers

    @contextlib.contextmanager
    def watched(*args: object, **kwargs: object):  # the real one, its broker kept: the cut's own record
        with real(*args, **kwargs) as broker:  # type: ignore[arg-type]
            brokers.append(broker)
            yield broker

    monkeypatch.setattr(power, "power_servers", watched)
    before = _children()
    runs = {"aof-always": run_designs(_power_loss("aof-always"), ["reliable"], Options()).runs[0]}
    # everysec fsyncs once a second: one that falls in the harness's brief pause of writes before the kill
    # leaves the cut nothing to take. Then the run is made again (at most 3 times), on the cut's own record.
    for _ in range(3):
        runs["aof-everysec"] = run_designs(_power_loss("aof-everysec"), ["reliable"], Options()).runs[0]
        if any("aof" in name for name in brokers[-1].shortened):
            break
    assert any("aof" in name for name in brokers[-1].shortened), brokers[-1].cut
    for run in runs.values():
        bf = run.broker_fault
        assert run.problems == [] and bf is not None and bf.kind == "power-loss" and bf.back_at is not None
        assert run.counts.stranded == 0 and run.timings.drained
    everysec, always = runs["aof-everysec"].counts, runs["aof-always"].counts
    # Enqueues acknowledged since the last fsync, still queued at the cut: gone with the page cache.
    assert everysec.lost > 0 and everysec.lost <= everysec.held_at_fault
    assert always.lost == 0 and always.enqueues_cut == 0  # every acknowledged enqueue was fsynced before its ack
    assert always.done + always.indeterminate == always.enqueued
    for run in runs.values():
        _lost_is_what_the_disk_lacks(run)
    assert _mounts() == [] and _ours(before) == []  # unmounted; its process, fusermount3's and the server's gone


def _lost_is_what_the_disk_lacks(run: object) -> None:
    """By id, from the ledger and the AOF the cut left (the event's lists): the jobs lost are exactly the
    acknowledged enqueues no durable command names that had not run by the cut; the jobs the durable
    state gave back (taken or acknowledged in memory only) all ran again, each a duplicate."""
    tl, c = run.timeline, run.counts  # type: ignore[attr-defined]
    ev = next(e for e in tl.fault_events if e.family == "power" and e.what == "cut")
    done = {ex.job for ex in tl.executions if ex.end is not None and not ex.failed}
    acked = {j for e in tl.enqueues if e.ok and e.t < ev.t for j in e.ids}
    lost = {j for j in tl.acknowledged if j not in done}
    assert lost == {j for j in acked - set(ev.data["durable"]) if j not in done}
    assert c.lost == len(lost) and c.enqueues_cut == len(acked - set(ev.data["durable"]))
    back = set(ev.data["held"]) - set(tl.held_at_fault)
    assert c.acks_cut == len(back) == c.acks_cut_reran and c.duplicated >= c.acks_cut
    runs_of = {j: sum(1 for ex in tl.executions if ex.job == j) for j in back}
    assert all(n >= 2 for n in runs_of.values()), runs_of


def _cut_timeline(synced: list[float] | None, durable: list[str], tear: bool = False) -> Timeline:
    """A run of three chunks of two jobs, sent at 1.0, 2.0 and 3.0 s, and a cut at 4.0 s."""
    tl = Timeline(
        index=0, spec="reliable", variant="", prefix="p", repeat=0, scenario={}, design=DesignFlags(),
        t0=0.0, started=0.0, window=5.0, produced=True,
    )  # fmt: skip
    tl.enqueues = [Enqueue(t, JobIds.of(ids)) for t, ids in ((1.0, ["a", "b"]), (2.0, ["c", "d"]), (3.0, ["e", "f"]))]
    data = {"shortened": {}, "aof": True, "exact": True, "torn": 0, "tear": tear, "synced": synced,
            "durable": durable, "cut": [], "held": None}  # fmt: skip
    tl.fault_events = [FaultEvent("power", "cut", 4.0, data)]
    return tl


def test_the_power_check_fires_when_the_disk_and_the_fsyncs_disagree() -> None:
    check = lambda tl: cut.power(History.of(tl), Sections())  # noqa: E731
    # The AOF was last fsynced at 2.5 s: chunk 1 was acknowledged before chunk 2 was sent (2.0 s).
    agree = check(_cut_timeline([2.5, 2.5], ["a", "b", "c", "d"]))
    assert agree.problems == [] and agree.counts["enqueues_cut"] == 2
    lost_synced = check(_cut_timeline([2.5, 2.5], ["c", "d"]))  # chunk 1 was fsynced, and is gone
    assert [p.check for p in lost_synced.problems] == ["power_fsync"] and lost_synced.problems[0].ids == ["a", "b"]
    kept_unsynced = check(_cut_timeline([2.5, 2.5], ["a", "b", "c", "d", "e"]))  # e was sent at 3.0 s
    assert [p.ids for p in kept_unsynced.problems] == [["e"]]
    assert check(_cut_timeline([2.5, 2.5], ["a", "b", "c", "d", "e"], tear=True)).problems == []  # a torn page
    written_back = _cut_timeline([2.5, 2.5], ["a", "b", "c", "d", "e"])
    written_back.fault_events[0].data["writeback"] = 0.5  # e, sent 1 s before the cut, may be written back
    assert check(written_back).problems == []
    written_back.fault_events[0].data["writeback"] = 1.5  # not yet
    assert [p.ids for p in check(written_back).problems] == [["e"]]
    never = check(_cut_timeline(None, ["a"]))  # never fsynced: nothing can be on the disk
    assert [p.ids for p in never.problems] == [["a"]] and never.counts["enqueues_cut"] == 5


def test_an_aof_is_read_as_a_server_loads_it() -> None:
    def resp(*args: str) -> bytes:
        return f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)

    token = "cbaaaaaaaaaa-"
    needle = Needle(token)
    body = resp("SELECT", "0") + resp("lpush", "q", f'{{"id":"{token}000001"}}')
    body += resp("xadd", "s", "17-0", "id", f"{token}000002") + resp("XACK", "s", "g", "17-0")
    whole = body + resp("MULTI") + resp("lpush", "q", f"{token}000003") + resp("EXEC")
    cmds, torn = aof.commands(whole)
    assert [c.name for c in cmds] == ["SELECT", "LPUSH", "XADD", "XACK", "MULTI", "LPUSH", "EXEC"] and torn == 0
    unfinished = body + resp("MULTI") + resp("lpush", "q", f"{token}000003")  # no EXEC: reverted on load
    cmds, torn = aof.commands(unfinished)
    assert [c.name for c in cmds][-1] == "XACK" and torn == len(unfinished) - len(body)
    cmds, torn = aof.commands(body[:-3])  # a torn last command
    assert [c.name for c in cmds][-1] == "XADD" and torn == len(resp("XACK", "s", "g", "17-0")) - 3
    named = aof.mentions(aof.Aof(files={"x.incr.aof": whole}), needle)
    assert named == {"000001": ["LPUSH"], "000002": ["XADD", "XACK"], "000003": ["LPUSH"]}


def test_wait_aof_is_refused_where_it_cannot_wait(tmp_path: Path) -> None:
    sc = Scenario.of(name="w", jobs=10, job_ms=1, workers=1, kills=0, persistence="aof-everysec", wait_aof=1)
    with pytest.raises(UsageError, match=r"naive cannot confirm an enqueue with WAITAOF"):
        run_designs(sc, ["naive"], Options())
    none = Scenario.of(name="w", jobs=10, job_ms=1, workers=1, kills=0, wait_aof=1)
    with pytest.raises(UsageError, match=r"wait_aof needs an AOF to wait for: persistence is none"):
        run_designs(none, ["reliable"], Options())


def test_power_loss_is_refused_with_its_reason_where_fuse_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from crashbench.faults import power

    monkeypatch.setattr(power, "unavailable", lambda: "a lazy file system (FUSE) needs root: run crashbench as root")
    with pytest.raises(UsageError, match=r"power-loss: a lazy file system \(FUSE\) needs root"):
        run_designs(_power_loss("aof-everysec"), ["reliable"], Options())


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_writeback_makes_bytes_durable_writeback_seconds_after_their_write(tmp_path: Path) -> None:
    """The model alone (lazyfs.Durability, no mount), on its own clock: bytes written at t are durable
    from t + writeback on, fsynced or not; an fsync makes all durable at once; a rename carries the
    history; without a writeback nothing is durable unsynced."""
    clock = Clock()
    state = lazyfs.Durability(tmp_path, writeback=30.0, now=clock)
    lazy = lazyfs.Durability(tmp_path, writeback=None, now=clock)
    log = tmp_path / "log"
    for model in (state, lazy):
        model.created("/log")
    log.write_bytes(b"a" * 100)
    for model in (state, lazy):
        model.wrote("/log", 100)  # at 1000
    clock.t += 10
    with open(log, "ab") as f:
        f.write(b"b" * 50)
    for model in (state, lazy):
        model.wrote("/log", 150)  # at 1010
    clock.t += 0.001
    state.wrote("/log", 150)  # the same grain (0.3 s): one entry, at its latest write
    assert len(state.history["/log"]) == 2
    clock.t = 1029.9
    assert state.lengths()["/log"] == 0 and lazy.lengths()["/log"] == 0
    clock.t = 1030.0
    assert state.lengths()["/log"] == 100  # what was written 30 s ago
    assert len(state.history["/log"]) == 1  # the entry written back, folded
    state.renamed("/log", "/moved")
    log.rename(tmp_path / "moved")
    assert state.cut() == {"/moved": (150, 100)}  # the 50 bytes of 1010 not yet written back at 1030
    assert lazy.lengths() == {"/log": 0}
    assert state.history == {}  # the cut took what was not written back

    with open(tmp_path / "moved", "ab") as f:
        f.write(b"c" * 20)
    state.wrote("/moved", 120)
    clock.t += 1
    state.synced("/moved", 120)  # an fsync: durable now, whatever the writeback
    assert state.lengths() == {"/moved": 120} and state.history == {}
    with open(tmp_path / "moved", "ab") as f:
        f.write(b"d" * 5)
    state.wrote("/moved", 125)
    clock.t += 100
    assert state.cut() == {}  # 100 s later: written back whole
    assert (tmp_path / "moved").stat().st_size == 125


@needs_fuse
def test_a_power_cut_under_a_writeback_keeps_what_was_written_back_and_cuts_what_was_just_written(
    tmp_path: Path,
) -> None:
    """On a real mount with a 0.2 s writeback: bytes written, then durable without an fsync once the
    mount's process says so (its own query, no sleep), survive the cut; bytes written just before the
    cut do not. "Just before" is checked on the clock the mount's process reads (CLOCK_MONOTONIC): a
    machine so slow that the cut came later than the writeback after the write tries again."""
    import time

    writeback = 0.2
    backing, mount = tmp_path / "disk", tmp_path / "mount"
    backing.mkdir()
    mount.mkdir()
    before = _children()
    disk = LazyFS(backing, mount, writeback=writeback)
    disk.start()
    try:
        for attempt in range(3):
            name = f"log{attempt}"
            fd = os.open(mount / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            written = time.monotonic()
            os.write(fd, b"a" * 100)
            durable = disk.durable()[f"/{name}"]
            if time.monotonic() - written < writeback:
                assert durable == 0  # not yet written back, never fsynced
            while disk.durable()[f"/{name}"] < 100:  # written back within the writeback
                time.sleep(0.01)
            start = time.monotonic()
            os.write(fd, b"b" * 50)
            os.close(fd)
            disk.power_cut()
            if time.monotonic() - start < writeback:
                break
        assert (mount / name).read_bytes() == b"a" * 100
    finally:
        disk.stop()
    assert not os.path.ismount(mount) and _mounts(str(tmp_path)) == [] and _ours(before) == []


@needs_fuse
def test_power_servers_mounts_its_lazy_file_system_with_the_writeback_asked() -> None:
    from crashbench.faults.power import power_servers

    for writeback in (None, 0.25):
        with power_servers("aof-everysec", None, writeback=writeback) as broker:
            assert broker.disk.writeback == writeback and broker.disk.proc is not None
            args = broker.disk.proc.args
            assert (["--writeback", "0.25"] if writeback else []) == list(args[5:])  # type: ignore[index]
            assert broker.disk.durable()  # the server's files, as the mount's process has them


def test_the_cost_table_of_the_findings_is_what_its_result_files_give() -> None:
    """docs/findings/power.md's table of the layer's cost is lab/lazyfs_cost.py's rendering of
    results/readme/lazyfs-cost (make lazyfs-cost)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    script, results = root / "lab" / "lazyfs_cost.py", root / "results" / "readme" / "lazyfs-cost"
    table = subprocess.run(
        [sys.executable, str(script), "--table", str(results)], capture_output=True, text=True, check=True
    ).stdout
    rows = [row for row in table.splitlines() if row.startswith("|")]
    doc = (root / "docs" / "findings" / "power.md").read_text()
    assert len(rows) == 2 + len(list(results.glob("*.json"))) and all(row in doc for row in rows)
