"""Fault families (crashbench.faults.family) and their registry: every kind has one owner, an entry is
checked against its family's keys, and a family added to the registry alone is parsed, planned and
driven by a real run, with nothing else touched."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from crashbench import faults
from crashbench.faults import registry
from crashbench.faults.family import FaultFamily, FaultRun
from crashbench.model import timeline
from crashbench.model.spec import Scenario
from crashbench.report import html
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, parse


def test_every_kind_has_one_family_and_every_family_takes_a_kind() -> None:
    kinds = registry.kinds()
    assert len(kinds) == len(set(kinds))
    assert {f.name for f in registry.FAMILIES} == {
        "signal",
        "network",
        "broker",
        "cluster",
        "deploy",
        "migrate",
        "eviction",
        "sentinel",
        "power",
        "clock",
        "hosts",
    }
    for family in registry.FAMILIES:
        assert "kind" in family.keys and family.kinds and family.summary
        assert all(registry.owner({"kind": k}) is family for k in family.kinds)
    assert registry.owner({}) is registry.owner({"kind": "signal"})  # a signal when it names no kind
    assert registry.owner({"kind": "meteor"}) is None


def test_an_entry_is_checked_against_its_own_family_s_keys() -> None:
    def problems(entry: dict[str, Any]) -> str:
        with pytest.raises(ScenarioError) as caught:
            parse({"faults": [entry]}, "x.toml")
        return str(caught.value)

    assert "unknown key 'toxic' (known: kind, signal, at" in problems({"signal": "SIGKILL", "toxic": "down"})
    assert "unknown key 'signal' for network (known: kind, toxic" in problems({"kind": "network", "signal": "x"})
    assert "unknown key 'count' for cluster-kill (known: kind, at, downtime)" in problems(
        {"kind": "cluster-kill", "count": 2}
    )
    sc = parse({"faults": [{"kind": "broker-kill", "at": 0.7, "downtime": 0.2}]}, "x.toml")
    assert (sc.broker.fault, sc.broker.fault_at, sc.broker.downtime) == ("broker-kill", 0.7, 0.2)  # sets [broker]
    assert [f.kind for f in faults.plan(sc)] == ["broker-kill"]


GUIDE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "add-a-fault-family.md"


def guide_family() -> FaultFamily:
    """The worked example of docs/how-to/add-a-fault-family.md, run as the guide prints it."""
    code = GUIDE.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    names: dict[str, Any] = {}
    exec(compile(code, str(GUIDE), "exec"), names)
    return names["FAMILY"]


def test_the_guide_s_family_in_the_registry_alone_is_parsed_planned_and_driven_by_a_real_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = guide_family()
    built = []

    def driver(run: FaultRun) -> Any:
        built.append(marker.driver(run))
        return built[-1]

    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, dataclasses.replace(marker, driver=driver)))
    with pytest.raises(ScenarioError, match="marker entry 1: at must be at least 0"):
        parse({"faults": [{"kind": "marker", "at": -1}]}, "x.toml")
    with pytest.raises(ScenarioError, match="unknown key 'slot' for marker"):
        parse({"faults": [{"kind": "marker", "slot": 1}]}, "x.toml")
    sc = parse({"faults": [{"kind": "marker", "at": 0.2}], "workload": {"jobs": 100, "job_ms": 5}}, "x.toml")
    assert [f.kind for f in faults.plan(sc)] == ["marker"]
    result = run_designs(sc, ["reliable"], Options())
    (m,) = built
    assert m.fired_at is not None and m.fired_at >= 0.2  # stepped from the run's loop until done
    assert [f.kind for f in result.runs[0].schedule] == ["marker"] and result.runs[0].counts.done == 100
    # Its history, saved with the timeline and read back; its band and style in the report.
    path = timeline.write([result.runs[0].timeline], tmp_path / "t.jsonl.gz")
    (again,) = timeline.read(path)
    assert [(e.family, e.what, e.t) for e in again.fault_events] == [("marker", "fired", m.fired_at)]
    page = html.render(result, [again])
    assert page.count('<g class="band marker">') == 1 and ".band.marker rect{fill:#bbb}" in page
    assert f"marked at {m.fired_at:.3f} s" in page


def test_the_families_keep_the_seed_s_order_the_periodic_group_then_entries_then_the_broker() -> None:
    sc = Scenario.of(kills=2, interval=0.3, workers=4, seed=3, fault="broker-kill", fault_at=0.3)
    sc = sc.replace(schedule=({"signal": "SIGTERM", "at": 0.3},))
    kinds = [(f.kind, getattr(f, "signal", None), f.at) for f in faults.plan(sc)]  # a server fault has none
    # ties at 0.3 keep the order they were drawn in: the entry's signal before the broker's fault
    assert kinds == [("signal", "SIGKILL", 0.3), ("signal", "SIGTERM", 0.3), ("broker-kill", None, 0.3),
                     ("signal", "SIGKILL", 0.6)]  # fmt: skip
