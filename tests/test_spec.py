"""The spec as nested sections: one record per scenario section, read and stored by flat names."""

from __future__ import annotations

import dataclasses

import pytest

from crashbench import scenario
from crashbench.model.faults import BrokerFaultRecord
from crashbench.model.queue import DesignSettings
from crashbench.model.sections import FIELD_SECTION, SECTION_RECORDS
from crashbench.model.spec import QueueSpec, Scenario, WorkloadSpec
from crashbench.model.workload import Workload
from crashbench.scenario.settings import SECTIONS


def test_each_section_record_holds_the_keys_its_section_takes() -> None:
    assert list(SECTION_RECORDS) == list(SECTIONS)
    for section, record in SECTION_RECORDS.items():
        names = {f.name for f in dataclasses.fields(record)}
        # [[faults]] entries land in faults.schedule: no key of the [faults] table
        assert names - {"schedule"} == set(SECTIONS[section]), section
    top = {f.name for f in dataclasses.fields(Scenario)}
    assert top == {"name", "description", "source", *SECTION_RECORDS, "expect", "library"}


def test_to_dict_stays_flat_in_the_order_results_store_it() -> None:
    data = Scenario().to_dict()
    sections = [name for record in SECTION_RECORDS.values() for name in (f.name for f in dataclasses.fields(record))]
    assert list(data) == ["name", "description", "source", *sections, "expect", "library"]
    assert Scenario.from_dict(data) == Scenario()
    assert Scenario().fingerprint() == "8557c0e9c341"  # as before the sections (tests/test_sharded.py)


def test_flat_names_go_to_their_sections() -> None:
    sc = Scenario.of(name="x", jobs=10, kills=2, stale_after=0.5, fault="kill", drain_timeout=3.0)
    assert (sc.name, sc.workload.jobs, sc.faults.kills, sc.queue.stale_after) == ("x", 10, 2, 0.5)
    assert (sc.broker.fault, sc.run.drain_timeout) == ("broker-kill", 3.0)  # "kill": its old name
    assert sc.replace(jobs=20).workload == dataclasses.replace(sc.workload, jobs=20)
    assert sc.value("jobs") == 10 and sc.value("name") == "x"
    assert FIELD_SECTION["wait_ms"] == "broker" and FIELD_SECTION["schedule"] == "faults"
    with pytest.raises(TypeError):
        sc.replace(no_such_setting=1)


def test_with_overrides_takes_flat_names_and_validates() -> None:
    sc = scenario.with_overrides(Scenario(), jobs=7, concurrency=2, signal="term")
    assert (sc.workload.jobs, sc.queue.concurrency, sc.faults.signal) == (7, 2, "SIGTERM")
    with pytest.raises(scenario.ScenarioError, match=r"queue\.stale_after must be a number > 0"):
        scenario.with_overrides(Scenario(), stale_after=0)


def test_the_design_settings_and_the_workload_come_from_the_sections() -> None:
    sc = Scenario(
        queue=QueueSpec(batch_size=3, stream_trim="approximate", socket_timeout=2.0),
        workload=WorkloadSpec(job_ms=4.0, job_dist="uniform"),
        library={"rq": {"worker_ttl": 30}},
    ).replace(wait_replicas=1, seed=9)
    s = sc.settings("rq")
    derived = {"options", "stream_approximate", "longest_job", "delayed"}
    for f in dataclasses.fields(DesignSettings):  # every other setting is a [queue] or [broker] key, as it is
        if f.name not in derived:
            assert getattr(s, f.name) == sc.value(f.name), f.name
    assert (s.options, s.stream_approximate, s.longest_job) == ({"worker_ttl": 30}, True, 0.006)
    assert sc.workload_model() == Workload(job_ms=4.0, job_dist="uniform", seed=9)


def test_the_broker_kill_has_one_name_and_its_old_one_reads_as_it() -> None:
    """`kill`, the [broker] fault's name before issue 27, in a scenario, a saved result's scenario or a
    saved broker-fault record, is `broker-kill`; the fingerprint stays the one results saved with the
    old name carry (3d867ae0dd2b: Scenario(fault="kill", fault_at=0.8) at commit 4407c8d)."""
    old = Scenario.from_dict({**Scenario().to_dict(), "fault": "kill", "fault_at": 0.8})
    new = Scenario.of(fault="broker-kill", fault_at=0.8)
    assert old.broker.fault == new.broker.fault == "broker-kill" and old.to_dict()["fault"] == "broker-kill"
    assert old.fingerprint() == new.fingerprint() == "3d867ae0dd2b"
    assert BrokerFaultRecord("kill", "none", 0.5, 3, [], 0).kind == "broker-kill"
    assert scenario.parse({"broker": {"fault": "kill"}}, "old.toml").broker.fault == "broker-kill"
    with pytest.raises(scenario.ScenarioError, match=r"broker\.fault must be one of none, broker-kill, failover"):
        scenario.parse({"broker": {"fault": "kil"}}, "x.toml")
