"""Pure unit tests of the compact evidence: job codes, JobIds, marks and execution columns (no server)."""

from __future__ import annotations

import math

from crashbench import jobids
from crashbench.jobids import JobIds, Marks
from crashbench.model.executions import Execution, Executions
from crashbench.model.workload import job_ids


def test_a_job_number_is_its_own_code_and_any_other_id_gets_one_of_its_own() -> None:
    assert [jobids.code(j) for j in ("000000", "000042", "1234567")] == [0, 42, 1234567]
    # Not canonical job numbers: each spelled back exactly, none confused with a number.
    others = ["42", "0000042", "a", "٣٣٣٣٣٣", "00004x"]
    codes = [jobids.code(j) for j in others]
    assert all(c < 0 for c in codes) and len(set(codes)) == len(others)
    assert [jobids.name(c) for c in codes] == others
    assert jobids.code("a") == codes[2]  # the same id, the same code
    assert jobids.known("never-seen-id") is None and jobids.known("000007") == 7


def test_job_ids_are_a_range_read_as_strings() -> None:
    ids = job_ids(5)
    assert isinstance(ids.codes, range) and list(ids) == ["000000", "000001", "000002", "000003", "000004"]
    assert ids[1:3] == ["000001", "000002"] and isinstance(ids[1:3].codes, range) and ids[-1] == "000004"
    assert "000004" in ids and "000005" not in ids and "4" not in ids and 4 not in ids
    assert JobIds.of(["000003", "000004"]).codes == range(3, 5)  # read back from a timeline: a range again
    assert list(JobIds.of(["000003", "b", "000001"])) == ["000003", "b", "000001"]
    assert "b" in JobIds.of(["000003", "b"]) and "c" not in JobIds.of(["000003", "b"])


def test_concatenated_enqueues_are_one_range_only_when_they_follow_each_other() -> None:
    assert JobIds.concat([job_ids(10)[0:4], job_ids(10)[4:10]]).codes == range(0, 10)
    gap = JobIds.concat([job_ids(10)[0:4], job_ids(10)[5:10]])
    assert not isinstance(gap.codes, range) and list(gap) == [f"{i:06d}" for i in (0, 1, 2, 3, 5, 6, 7, 8, 9)]
    mixed = JobIds.concat([JobIds.of(["a"]), job_ids(2)])
    assert list(mixed) == ["a", "000000", "000001"]
    assert list(JobIds.concat([])) == []


def test_marks_say_whether_a_code_is_new_and_stay_small_for_a_stray_huge_number() -> None:
    m = Marks()
    assert [m.add(c) for c in (3, 3, 0, -5, -5, 10**12)] == [True, False, True, True, False, True]
    assert len(m.numbers) < 2**21  # 10**12 went to the set, not into a terabyte of bytes


def test_execution_columns_read_back_as_the_executions_they_hold() -> None:
    rows = [
        Execution("000001", "w0", 1.0, 2.0, False, 10, 7, 2.5, False),
        Execution("x", "w1", 1.5, None, False, 11, 8),
        Execution("000002", "w0", 3.0, 4.0, True, 10, 7),
        Execution("000001", "w1", 5.0, 6.0, False, 11, 8, 6.1, True),
    ]
    runs = Executions.of(rows)
    assert list(runs) == rows and runs[-1] == rows[-1] and runs[1:3] == rows[1:3] and runs == rows
    assert len(runs.contexts) == 2  # (worker, pid, thread) once each
    assert math.isnan(runs.ends[1]) and runs.job(1) == "x" and runs.worker(1) == "w1" and runs.pid(1) == 11
    runs.rebase(1.0)
    assert [(ex.start, ex.end, ex.acked) for ex in runs] == [(0.0, 1.0, 1.5), (0.5, None, None), (2.0, 3.0, None),
                                                            (4.0, 5.0, 5.1)]  # fmt: skip
