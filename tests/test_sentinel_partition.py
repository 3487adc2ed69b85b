"""sentinel-partition (crashbench.faults.sentinel.partition): a split brain on real servers, real sentinels
and real worker processes. The primary is cut off from its sentinels, its replicas and the workers that
found it through them, while the producer and one worker go on writing to it; the sentinels promote a
replica; the partition heals. What the old primary alone acknowledged is lost, exactly as the harness's
readings of both sides count it; with min-replicas-to-write it soon refuses, and loses less."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import psutil
import pytest

from crashbench.evidence.checker import History, Sections
from crashbench.faults.sentinel import partition
from crashbench.model.faults import BrokerFaultRecord
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.timeline import DesignFlags, Enqueue, FaultEvent, Timeline
from crashbench.model.workload import job_ids


def _split(small: Scenario, monkeypatch: pytest.MonkeyPatch, **settings: object) -> tuple[DesignRun, list[int]]:
    """One reliable run under the split brain (short: the cut at 0.5 s, healed 0.3 s after the promotion),
    and the pids of every process its topology started (servers, sentinels, the proxy in front). The
    producer enqueues 50 jobs a second until well after the heal whatever a loaded machine's timing, more
    than the minority's one worker runs (30 ms each): it cannot complete everything the old primary takes
    (with 10 ms jobs it can, and nothing is lost)."""
    from crashbench.run import session
    from crashbench.run.session import Options, run_designs

    pids: list[int] = []
    real = session.sentinel_broker

    @contextlib.contextmanager
    def watched(*args: object, **kwargs: object) -> Iterator[object]:
        with real(*args, **kwargs) as broker:  # type: ignore[arg-type]
            topology = broker.topology
            pids.extend(p.proc.pid for p in topology.processes if p.proc is not None)
            assert topology.proxy is not None  # the partitionable topology
            pids.append(topology.proxy.proc.pid)
            yield broker

    monkeypatch.setattr(session, "sentinel_broker", watched)
    sc = small.replace(
        jobs=300, job_ms=30, workers=3, kills=0, fault="sentinel-partition", fault_at=0.5, downtime=0.3,
        produce_s=6.0, minority_workers=1, socket_timeout=1.0, **settings,
    )  # fmt: skip
    return run_designs(sc, ["reliable"], Options()).runs[0], pids


def _gone(pids: list[int]) -> bool:
    return not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_a_split_brain_loses_exactly_what_the_old_primary_alone_acknowledged(
    small: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, pids = _split(small, monkeypatch)
    bf, c, tl = run.broker_fault, run.counts, run.timeline
    assert run.problems == [] and bf is not None and bf.kind == "sentinel-partition" and tl is not None
    assert bf.back_at is not None and 1.0 <= bf.back_at - bf.at < 30  # the sentinels' own decision
    assert bf.promoted_offset == bf.primary_offset  # the promoted replica took over with the cut's state
    # The producer went on: the old primary acknowledged its enqueues until the heal, refused none.
    assert c.acked_on_old_primary > 0 and c.refused_on_old_primary == 0
    # Lost: what it acknowledged that the promoted replica never had and nobody completed (read from both sides).
    assert c.lost == c.not_replicated == c.acked_during_lag > 0
    assert c.lost <= c.old_primary_only <= c.acked_on_old_primary
    assert c.workers_on_old_primary == 1  # the minority's worker, still served by the old primary as it healed
    assert c.stranded == 0 and c.unexpected == 0
    assert len(pids) == 7 and _gone(pids)  # three servers, three sentinels, the proxy


@pytest.mark.slow
def test_under_min_replicas_to_write_the_old_primary_soon_refuses_and_what_it_took_before_is_lost(
    small: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, pids = _split(small, monkeypatch, min_replicas_to_write=1, min_replicas_max_lag=1)
    bf, c, tl = run.broker_fault, run.counts, run.timeline
    assert run.problems == [] and bf is not None and bf.back_at is not None and tl is not None
    assert c.refused_on_old_primary > 0  # NOREPLICAS: its replicas' acknowledgements stopped with the cut
    # It acknowledged only until its replicas' last acknowledgement was older than the max lag (Redis
    # counts whole seconds, refreshed once a second): 1.2-2.4 s after the cut here, at most 5 s on a loaded
    # machine, then refused every one.
    split = [e for e in tl.enqueues if e.t >= bf.at and (e.lag or not e.ok)]
    acked = [e.t for e in split if e.ok]
    assert acked and max(acked) - bf.at < 5.0
    assert all(not e.ok for e in split if e.t > min(e.t for e in split if not e.ok))
    assert c.lost == c.not_replicated == c.acked_during_lag <= c.acked_on_old_primary
    assert c.unconfirmed <= c.refused_on_old_primary and c.unexpected == 0
    assert _gone(pids)


def _timeline(**record: object) -> Timeline:
    """A split brain's history, made by hand: 30 enqueues acknowledged before the cut at 1 s, 20 by the
    old primary after it, 10 refused, the heal at 4 s; the old primary held 15 of the 20 at the heal."""
    ids = job_ids(60)
    before, after, refused = ids[0:30], ids[30:50], ids[50:60]
    bf = BrokerFaultRecord("sentinel-partition", "none", 1.0, 15, [], 30, back_at=3.0, **record)  # type: ignore[arg-type]
    return Timeline(
        0, "reliable", "", "p:", 0, {}, DesignFlags(), 0.0, 0.0, 30.0, produced=True,
        enqueues=[Enqueue(0.5, before), Enqueue(2.0, after, lag=True), Enqueue(3.5, refused, ok=False)],
        broker_fault=bf, held_at_fault=list(ids[35:50]), held_after_promotion=list(ids[0:5]),
        fault_events=[FaultEvent("sentinel", "healed", 4.0, {"workers_on_old_primary": 2})],
    )  # fmt: skip


def test_the_split_brain_checker_counts_both_sides_and_fires_on_an_offset_that_moved() -> None:
    tl = _timeline(primary_offset=100, promoted_offset=100)
    section = partition.split_brain(History(tl, Scenario(), None), Sections())  # type: ignore[arg-type]
    assert section.counts == {
        "acked_on_old_primary": 20, "refused_on_old_primary": 10, "old_primary_only": 15, "workers_on_old_primary": 2,
    }  # fmt: skip
    assert section.problems == []
    # The promoted replica took over at another offset than the primary's at the cut: its reading at the cut
    # is not what it took over with, and the counts built on it are not evidence (exit 4).
    moved = _timeline(primary_offset=100, promoted_offset=140)
    section = partition.split_brain(History(moved, Scenario(), None), Sections())  # type: ignore[arg-type]
    assert [p.check for p in section.problems] == ["split_brain"] and "140" in section.problems[0].message
    # Never healed (the run stopped first): nothing counted as the old primary's alone, nobody on it.
    unhealed = _timeline(primary_offset=100, promoted_offset=100)
    unhealed.fault_events = []
    counts = partition.split_brain(History(unhealed, Scenario(), None), Sections()).counts  # type: ignore[arg-type]
    assert counts["old_primary_only"] == 0 and counts["workers_on_old_primary"] == 0
    # Another fault's run: no section of its own.
    other = _timeline()
    assert other.broker_fault is not None
    other.broker_fault.kind = "sentinel-kill"
    assert partition.split_brain(History(other, Scenario(), None), Sections()).counts == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("broker", "problem"),
    [
        ({"fault": "sentinel-kill", "minority_workers": 1}, 'minority_workers is for fault = "sentinel-partition"'),
        ({"fault": "sentinel-partition", "minority_workers": 5}, "more than the run's workers (4)"),
        ({"fault": "broker-kill", "min_replicas_to_write": 1}, "min_replicas_to_write configures a Sentinel"),
        ({"fault": "sentinel-partition", "min_replicas_to_write": 3}, "min_replicas_to_write must be"),
    ],
)
def test_a_split_brain_s_settings_that_cannot_hold_are_refused(broker: dict[str, object], problem: str) -> None:
    from crashbench.errors import ScenarioError
    from crashbench.scenario import parse

    with pytest.raises(ScenarioError, match=re.escape(problem)):
        parse({"workload": {"workers": 4}, "broker": broker}, "split.toml")
