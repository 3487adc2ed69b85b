"""The fault specs are one union (crashbench.model.faults): a worker signal, a network fault, a fault of
the server, each its own record, stored as they always were so that saved results and timelines read
and compare alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashbench.model.faults import Fault, NetworkFault, SignalFault, fault_dict, fault_of
from crashbench.model.results import Result, ResultFormatError

ORDER = ("index", "at", "slot", "kind", "signal", "kill_when", "target", "duration", "slots", "toxic", "after")
ROOT = Path(__file__).resolve().parent.parent
SAVED = [
    ROOT / "results/readme/20261203-064521-33bd600d-compare-default-naive-reliable-stream.json",
    ROOT / "results/readme/network/20261203-120835-80e05aa2-compare-net-half-open-reliable-stream.json",
    ROOT / "results/readme/cluster-faults/20261201-020556-555b0f03-compare-cluster-kill-reliable-stream.json",
]


def test_each_kind_is_its_own_record_and_reads_back_as_it() -> None:
    made = [
        SignalFault(0, 0.5, slot=2, signal="SIGSTOP", duration=1.0),
        NetworkFault(1, 1.0, target="producer", duration=2.0, toxic={"name": "timeout"}),
        Fault(2, 0.9, "cluster-kill", duration=0.4),
    ]
    assert [type(fault_of(fault_dict(f))) for f in made] == [SignalFault, NetworkFault, Fault]
    assert [fault_of(fault_dict(f)) for f in made] == made
    assert [f.on_worker for f in made] == [True, False, False]
    assert not hasattr(made[2], "slot") and not hasattr(made[0], "toxic")  # no field of another kind
    assert fault_of({"index": 3, "at": 1.0, "kind": "kill", "slot": -1}) == Fault(3, 1.0, "broker-kill")


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.parent.name)
def test_a_saved_result_s_schedule_is_written_again_as_it_was(path: Path) -> None:
    """Every kind's keys, the inapplicable at their defaults, in the order results have always had."""
    data = json.loads(path.read_text())
    again = json.loads(Result.from_dict(data).to_json())
    saved = [f for run in data["runs"] for f in run["schedule"]]
    written = [f for run in again["runs"] for f in run["schedule"]]
    assert saved and len(written) == len(saved)
    assert [list(f) for f in written] == [[*ORDER]] * len(saved)  # `after` too, in a file saved before it
    assert [{k: f[k] for k in old} for f, old in zip(written, saved, strict=True)] == saved


def test_a_schedule_entry_that_is_no_fault_is_refused_with_where() -> None:
    data = json.loads(SAVED[0].read_text())
    data["runs"][0]["schedule"][0]["kind"] = 5
    with pytest.raises(ResultFormatError, match=r"runs\[0\]\.schedule\[0\]: expected a fault"):
        Result.from_dict(data)
    data["runs"][0]["schedule"][0] |= {"kind": "signal", "slot": "two"}
    with pytest.raises(ResultFormatError, match=r"schedule\[0\]\.slot: expected a whole number"):
        Result.from_dict(data)
