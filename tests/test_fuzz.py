"""Fuzzing what users write: scenario documents, scenario files and threshold rules.

Whatever the input, the only outcomes allowed are a valid Scenario / Threshold or crashbench's own
ScenarioError / UsageError / ThresholdSyntaxError, which the command line turns into exit 2. Any
other exception would be a traceback (and exit 1 or 5) for a mistake in a file.
"""

from __future__ import annotations

import math
import os
import string
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crashbench import scenario
from crashbench.errors import ScenarioError, UsageError
from crashbench.model import thresholds
from crashbench.model.thresholds import Threshold, ThresholdSyntaxError
from crashbench.scenario import problems_of, with_overrides

# Derandomized: the suite gives the same verdict on every run (a failure found once is kept as an
# @example below); no database, so no .hypothesis directory in the checkout.
FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
MAX_EXAMPLES = int(os.environ.get("CRASHBENCH_FUZZ_EXAMPLES", "0"))  # to fuzz longer and at random, by hand
if MAX_EXAMPLES:
    FUZZ = settings(FUZZ, max_examples=MAX_EXAMPLES, derandomize=False)

# Values of every type TOML has, and the ones that break naive code: nan, inf, huge ints, bools.
SCALARS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**63, 2**63 - 1, 10**400, True, False]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308]),
    st.text(max_size=12),
    st.sampled_from(["SIGKILL", "term", "9", "fixed", "longtail", "mid-job", "kill", "failover", "aof-always"]),
    st.dates(),
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
FIELDS = [name for names in scenario.SECTIONS.values() for name in names]
METRICS = list(thresholds.METRICS)


def section(keys: list[str]) -> st.SearchStrategy[Any]:
    """A table of real keys (and a stray one) with values of any type; sometimes not a table at all."""
    table = st.dictionaries(st.sampled_from([*keys, "bogus"]), VALUES, max_size=len(keys))
    return st.one_of(table, table, table, VALUES)


RULE_VALUES = st.one_of(
    VALUES,
    st.builds(lambda op, n, unit: f"{op} {n}{unit}", st.sampled_from(["==", "<=", ">", "=", "!=", ""]),
              st.one_of(st.integers(), st.floats(), st.text(max_size=4)), st.sampled_from(["", "s", "ms", "%", "x"])),
)  # fmt: skip
EXPECT = st.dictionaries(
    st.sampled_from(["naive", "reliable", "celery:acks-late"]),
    st.one_of(st.dictionaries(st.sampled_from([*METRICS[:8], "wall", "recovery_p95", "nope"]), RULE_VALUES), VALUES),
    max_size=2,
)
DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "name": VALUES,
        "description": VALUES,
        **{name: section(list(keys)) for name, keys in scenario.SECTIONS.items()},
        "expect": st.one_of(EXPECT, VALUES),
        "library": st.one_of(st.dictionaries(st.sampled_from(["rq", "celery"]), VALUES, max_size=2), VALUES),
        "extra": VALUES,
    },
)


@pytest.mark.slow
@FUZZ
@given(DOCUMENTS)
@example({"broker": {"fault_at": "soon"}})
@example({"workload": 3})
@example({"faults": {"interval": math.inf, "kills": True, "seed": 10**400}})
@example({"expect": {"naive": {"lost": 10**400}}})
@example({"workload": {"\n": 0}, "expect": {"a\nb": {"lost: x": 0, "lost": "== 0: lost == 1"}}})
def test_any_document_is_a_scenario_or_a_scenario_error(doc: dict[str, Any]) -> None:
    try:
        sc = scenario.parse(doc, "fuzz")
    except ScenarioError as exc:
        assert exc.problems and all(isinstance(p, str) and "\n" not in p for p in exc.problems)
        return
    assert problems_of(sc) == []
    sc.fingerprint()  # what every run of it records
    sc.to_dict()


TOML_WORDS = st.sampled_from(
    ["[workload]", "[faults]", "[broker]", "[expect.naive]", "jobs = ", "interval = ", "nan", "inf", "-inf",
     '"x"', "true", "[1, 2]", "{a = 1}", "\n", "=", "1e999", "9" * 5000, "[" * 2000, "\ufeff", "é"]
)  # fmt: skip


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.lists(TOML_WORDS, max_size=12).map(lambda w: "".join(w).encode())))
@example(b"\xff\xfe[workload]\njobs = 3\n")
@example(("a = " + "9" * 5000).encode())
@example(b"a = " + b"[" * 5000)
def test_any_file_is_a_scenario_or_a_scenario_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.toml"
        path.write_bytes(raw)
        try:
            scenario.load(str(path))
        except ScenarioError as exc:
            assert exc.problems


@FUZZ
@given(st.dictionaries(st.sampled_from([n for n in FIELDS if n != "designs"]), SCALARS, min_size=1, max_size=4))
def test_any_override_is_a_scenario_or_a_scenario_error(values: dict[str, Any]) -> None:
    try:
        sc = with_overrides(scenario.Scenario(), **values)
    except ScenarioError:
        return
    assert problems_of(sc) == []


RULES = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda design, metric, stat, op, rhs: f"{design}{metric}{stat}{op}{rhs}",
        st.sampled_from(["", "reliable: ", "celery:acks-late: ", ": "]),
        st.sampled_from([*METRICS, "bogus", ""]),
        st.sampled_from(["", ".median", ".max", ".p99", "."]),
        st.sampled_from(["=", "==", "<", "<=", "=>", "~", " != "]),
        st.one_of(st.text(string.digits + ".-+%smx ", max_size=10), st.sampled_from(["kills", "nan", "9" * 400])),
    ),
)  # fmt: skip


@FUZZ
@given(RULES)
@example("lost == " + "9" * 400)
@example("recovery_p95 < " + "9" * 400 + "s")
@example("jobs_per_s >= -" + "9" * 400 + "%")
def test_any_rule_is_a_threshold_or_a_syntax_error(rule: str) -> None:
    try:
        t = thresholds.parse(rule)
    except ThresholdSyntaxError as exc:
        assert str(exc)
        return
    assert isinstance(t, Threshold) and t.metric in thresholds.METRICS
    assert t.ref is not None or (t.value is not None and math.isfinite(t.value))
    t.rule()


@FUZZ
@given(st.sampled_from(METRICS), RULE_VALUES)
def test_any_expectation_entry_is_a_threshold_or_a_syntax_error(metric: str, value: Any) -> None:
    try:
        t = thresholds.parse_entry("reliable", metric, value, source="scenario")
    except (ThresholdSyntaxError, UsageError):
        return
    assert t.ref is not None or (t.value is not None and math.isfinite(t.value))


def test_a_toml_document_round_trips_through_the_fuzzed_types() -> None:
    # The generators' values are what tomllib itself produces: nan, inf and dates included.
    doc = tomllib.loads('a = nan\nb = -inf\nc = 1979-05-27\nd = [1, "x"]\n[e]\nf = true\n')
    assert math.isnan(doc["a"]) and doc["b"] == -math.inf and doc["e"] == {"f": True}
