"""How a network fault's liveness is told: each faulted slot's own resume after the heal, and the
slowest as the headline (the queue is back once every faulted worker is). Pure counting on a
hand-made timeline; the real faults are in test_network.py and test_netns.py."""

from __future__ import annotations

from types import SimpleNamespace

from crashbench.faults.network import liveness
from crashbench.model.faults import NetworkFaultRecord
from crashbench.report.render import network_line


def _timeline(starts: list[tuple[str, float]]) -> SimpleNamespace:
    executions = [SimpleNamespace(worker=w, start=t, end=t + 0.01, completed=True) for w, t in starts]
    return SimpleNamespace(
        executions=executions, enqueues=[], depth=[], drained=True, drained_at=5.0,
        slot_of=lambda: {"w0": 0, "w1": 1, "w2": 2},
    )  # fmt: skip


def test_each_slot_resumes_on_its_own_and_the_slowest_is_the_headline() -> None:
    nf = NetworkFaultRecord(index=0, toxic="drop", slots=[0, 1], at=1.0, healed_at=2.0)
    liveness(nf, _timeline([("w0", 2.06), ("w1", 3.12), ("w0", 3.5), ("w2", 2.01)]))  # type: ignore[arg-type]
    assert nf.resume_ms == 60.0 and nf.slot_resume_ms == [60.0, 1120.0] and nf.slowest_resume_ms == 1120.0
    assert "all resumed 1.12 s after (slot 0 0.06 s, slot 1 1.12 s)" in network_line(nf)


def test_a_slot_that_never_resumes_leaves_no_slowest() -> None:
    nf = NetworkFaultRecord(index=0, toxic="drop", slots=[0, 1], at=1.0, healed_at=2.0)
    liveness(nf, _timeline([("w0", 2.06), ("w2", 2.5)]))  # type: ignore[arg-type]
    assert nf.slot_resume_ms == [60.0, None] and nf.slowest_resume_ms is None and nf.stuck == [1]
    assert "not all resumed (slot 0 0.06 s, slot 1 never)" in network_line(nf)
