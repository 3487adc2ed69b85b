"""Thresholds: what a design must achieve, in a small readable syntax, evaluated over a result's runs.

    [DESIGN: ]METRIC[.STAT] OP VALUE[UNIT]

    lost=0                      every run of every design loses nothing
    reliable: duplicated<=2     one design (names may contain ":"; the separator is ": ")
    lost == kills_mid_job       the right-hand side may name another count of the same run
    recovery_p95<2s             timings take s or ms (the metric's own unit when none is given)
    jobs_per_s>=-10%            relative to the baseline's value of the same metric and design
    lost.median<=1              a statistic over repeats: min, median, max

OP is one of = == != <= >= < >. A count is checked on every run (a gate over repeats must hold in
each of them; the reported value is the worst run's); a timing on the median of the runs, unless a
statistic is given. A threshold whose value does not exist (no killed job was recovered, so there is
no recovery time; no baseline run of the design) is inconclusive, never passed.

A scenario declares them per design (`[expect.<design>]`, `metric = "op value"`), the command line
with `--threshold`, for every design or for one. A design with at least one of those is also held to
`undrained == 0` and `worker_crashes == 0` (source "default") unless it names those metrics itself:
nobody injected what they count, so any is a failure; in a run with network faults, `stuck_workers
== 0` as well (a worker that never resumed). A design with none of them is unchecked.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from crashbench.errors import UsageError
from crashbench.model.counts import Counts
from crashbench.model.results import DesignRun, Result, ThresholdResult, group, label

COUNT_NAMES = tuple(f.name for f in dataclasses.fields(Counts) if f.name != "stranded_at")
# Held at 0 for every design that has any explicit threshold: what they count was never injected.
DEFAULT_ZERO = ("undrained", "worker_crashes")
DEFAULT_ZERO_NETWORK = ("stuck_workers",)  # ... in a run with network faults: a worker that never resumed


@dataclass(frozen=True, slots=True)
class Metric:
    unit: str  # "" for counts; "s", "ms", "jobs/s", "x"
    get: Callable[[DesignRun], float | None]
    help: str


def _timing(field: str) -> Callable[[DesignRun], float | None]:
    return lambda run: getattr(run.timings, field)


METRICS: dict[str, Metric] = {
    **{name: Metric("", lambda run, n=name: getattr(run.counts, n), "count") for name in COUNT_NAMES},
    "jobs_per_s": Metric("jobs/s", _timing("jobs_per_s"), "jobs done per second of wall time"),
    "wall": Metric("s", _timing("wall_s"), "first worker started -> drained"),
    "ratio_to_ideal": Metric("x", lambda run: run.timings.ratio_to_ideal, "wall time / ideal time"),
    "drain": Metric("s", _timing("drain_s"), "last fault -> drained"),
    "startup": Metric("ms", _timing("startup_ms_median"), "worker spawn -> READY, median"),
    "restart": Metric("ms", _timing("restart_ms_median"), "kill -> replacement READY, median"),
    "recovery_p50": Metric("ms", _timing("recovery_ms_p50"), "fault -> the hit job starts again, p50"),
    "recovery_p95": Metric("ms", _timing("recovery_ms_p95"), "the same, p95"),
    "recovery_max": Metric("ms", _timing("recovery_ms_max"), "the same, max"),
    "delay_lateness_p50": Metric("ms", _timing("delay_lateness_ms_p50"), "a delayed job: due -> first start, p50"),
    "delay_lateness_p95": Metric("ms", _timing("delay_lateness_ms_p95"), "the same, p95"),
    "delay_lateness_max": Metric("ms", _timing("delay_lateness_ms_max"), "the same, max"),
}
STATS = ("min", "median", "max")
OPS: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}
_SCALE = {("s", "ms"): 1000.0, ("ms", "s"): 0.001}

_RULE = re.compile(r"^\s*(?P<metric>[A-Za-z_]\w*)(?:\.(?P<stat>\w+))?\s*(?P<op>==|!=|<=|>=|<|>|=)\s*(?P<rhs>.*?)\s*$")
_VALUE = re.compile(r"^(?P<number>[+-]?\d+(?:\.\d+)?)\s*(?P<unit>ms|s|%)?$")


class ThresholdSyntaxError(ValueError):
    """The message says what is wrong and how it should look."""


@dataclass(frozen=True, slots=True)
class Threshold:
    metric: str
    op: str
    value: float | None = None  # absolute, in the metric's unit; or the percentage when relative
    ref: str | None = None  # another count of the same run
    relative: bool = False  # value is a percentage of the baseline's value
    stat: str | None = None  # None: counts on every run, timings on the median
    design: str | None = None  # None: every design
    source: str = "command line"

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    def rule(self) -> str:
        """The threshold without its design, as it would be written."""
        name = f"{self.metric}.{self.stat}" if self.stat else self.metric
        if self.ref is not None:
            rhs = self.ref
        elif self.relative:
            rhs = f"{self.value:+g}%"
        else:
            rhs = f"{self.value:g}{self.unit if self.unit in ('s', 'ms') else ''}"
        return f"{name} {self.op} {rhs}"

    def __str__(self) -> str:
        return f"{self.design}: {self.rule()}" if self.design else self.rule()


def parse(text: str, design: str | None = None, source: str = "command line") -> Threshold:
    """`[DESIGN: ]METRIC[.STAT] OP VALUE[UNIT]`; raises ThresholdSyntaxError with a clear message."""
    body = text
    if ": " in text:
        design, body = (part.strip() for part in text.split(": ", 1))
    m = _RULE.match(body)
    if not m:
        raise ThresholdSyntaxError(f"{text!r}: write METRIC OP VALUE, like lost=0, duplicated<=2, recovery_p95<2s")
    metric, stat, op, rhs = m["metric"], m["stat"], m["op"], m["rhs"]
    op = "==" if op == "=" else op
    if metric not in METRICS:
        raise ThresholdSyntaxError(f"{text!r}: unknown metric {metric!r} (known: {', '.join(METRICS)})")
    if stat is not None and stat not in STATS:
        raise ThresholdSyntaxError(f"{text!r}: unknown statistic .{stat} (known: {', '.join(STATS)})")
    if rhs in COUNT_NAMES:
        if METRICS[metric].unit:
            raise ThresholdSyntaxError(f"{text!r}: a timing compares with a number, not with the count {rhs!r}")
        return Threshold(metric, op, ref=rhs, stat=stat, design=design, source=source)
    v = _VALUE.match(rhs)
    if not v:
        raise ThresholdSyntaxError(
            f"{text!r}: {rhs!r} is not a number (with s, ms or %), nor a count name; like 0, 2s, 500ms, -10%"
        )
    number, unit = float(v["number"]), v["unit"] or ""
    if not math.isfinite(number):  # hundreds of digits: float() gives inf, which every comparison misreads
        raise ThresholdSyntaxError(f"{text[:40]!r}...: {v['number'][:20]}... is too large a number")
    metric_unit = METRICS[metric].unit
    if unit == "%":
        return Threshold(metric, op, number, relative=True, stat=stat, design=design, source=source)
    if unit:
        if metric_unit not in ("s", "ms"):
            raise ThresholdSyntaxError(f"{text!r}: {metric} is {metric_unit or 'a count'}, not a time")
        number *= _SCALE.get((unit, metric_unit), 1.0)
    return Threshold(metric, op, number, stat=stat, design=design, source=source)


def parse_entry(design: str, metric: str, value: Any, source: str) -> Threshold:
    """A scenario's `[expect.<design>]` entry: `metric = 0` or `metric = "<= 2"` / `"< 2s"` / `"== kills"`."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        # a list or table is named, not shown: it may hold anything, even an int repr() refuses
        shown = f"a {type(value).__name__}" if isinstance(value, list | dict) else repr(value)
        raise ThresholdSyntaxError(f'{metric} = {shown}: write a number or a string like "<= 2" or "< 2s"')
    huge = isinstance(value, int) and value.bit_length() > 1024  # inf as a float; str() refuses > 4300 digits
    if huge or (isinstance(value, float) and not math.isfinite(value)):
        if isinstance(value, int):
            raise ThresholdSyntaxError(f"{metric} = an integer of {value.bit_length()} bits: too large a number")
        raise ThresholdSyntaxError(f"{metric} = {value!r}: a threshold must be a finite number")
    # Plain decimal digits, the only numbers the rule syntax has: :g would turn a huge int into a float
    # (OverflowError) and write 1e-07, which the syntax does not read.
    if isinstance(value, int | float):
        number = str(value) if isinstance(value, int) else format(decimal.Decimal(repr(value)), "f")
        text = f"{metric} == {number}"
    else:
        text = f"{metric} {value}"
    if isinstance(value, str) and ": " in value:  # the table names the design; a rule's own prefix would override it
        raise ThresholdSyntaxError(f"{metric} = {value!r}: no DESIGN: prefix here, the [expect.DESIGN] table names it")
    if isinstance(value, str) and not re.match(r"^\s*(==|!=|<=|>=|<|>|=)", value):
        text = f"{metric} == {value}"
    return parse(text, design=design, source=source)


def _stat(stat: str, values: Sequence[float]) -> float:
    return {"min": min, "max": max, "median": statistics.median}[stat](values)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def evaluate(
    t: Threshold, design: str, runs: Sequence[DesignRun], baseline: Sequence[DesignRun] | None
) -> ThresholdResult:
    """Evaluate one threshold over the runs of one design (its repeats); `baseline`: the baseline's runs of it."""
    metric = METRICS[t.metric]
    values = [metric.get(r) for r in runs]

    def result(status: str, actual: float | None, expected: float | None, note: str = "", base: float | None = None):
        return ThresholdResult(
            design=design, threshold=t.rule(), source=t.source, status=status, actual=_round(actual),
            expected=_round(expected), baseline=_round(base), unit=metric.unit, values=[_round(v) for v in values],
            note=note,
        )  # fmt: skip

    present = [v for v in values if v is not None]
    if not present:
        return result("inconclusive", None, None, f"no {t.metric} value (for example, no killed job was recovered)")
    stat = t.stat or ("median" if metric.unit or t.relative else None)
    if stat is None:  # a count, checked on every run; the reported run is the first failing, else the worst
        checked = [(v, _expected_count(t, run), run.seed) for run, v in zip(runs, values, strict=True) if v is not None]
        for v, expected, seed in checked:
            if not OPS[t.op](v, expected):
                return result("fail", v, expected, f"run with seed {seed}" if len(runs) > 1 else "")
        pick = min if t.op in (">", ">=") else max
        v, expected, _ = pick(checked, key=lambda c: c[0] - c[1])
        return result("pass", v, expected, f"all {len(runs)} runs" if len(runs) > 1 else "")
    actual = _stat(stat, present)
    base = None
    if t.ref is not None:
        expected = _stat(stat, [_expected_count(t, r) for r in runs])
    elif t.relative:
        base_values = [v for r in baseline or () if (v := metric.get(r)) is not None]
        if baseline is None:
            return result("inconclusive", actual, None, "relative threshold without a baseline")
        if not base_values:
            return result("inconclusive", actual, None, f"the baseline has no {t.metric} value for {design}")
        base = _stat(stat, base_values)
        assert t.value is not None
        expected = base * (1 + t.value / 100)
    else:
        assert t.value is not None
        expected = t.value
    note = f"{stat} of {len(present)} runs" if len(runs) > 1 else ""
    return result("pass" if OPS[t.op](actual, expected) else "fail", actual, expected, note, base)


def _expected_count(t: Threshold, run: DesignRun) -> float:
    if t.ref is not None:
        return getattr(run.counts, t.ref)
    assert t.value is not None
    return t.value


def defaults(explicit: Sequence[Threshold], network: bool = False) -> list[Threshold]:
    """The implicit `== 0` thresholds for a design whose explicit ones are `explicit`: none without
    any (an unchecked design stays unchecked), and none for a metric the explicit ones already name;
    with network faults in its runs, stuck workers too."""
    if not explicit:
        return []
    named = {t.metric for t in explicit}
    metrics = DEFAULT_ZERO + (DEFAULT_ZERO_NETWORK if network else ())
    return [Threshold(m, "==", 0.0, source="default") for m in metrics if m not in named]


def check_all(
    runs: Sequence[DesignRun],
    declared: dict[str, Sequence[Threshold]],
    given: Sequence[Threshold],
    baseline: Sequence[DesignRun] | None = None,
) -> list[ThresholdResult]:
    """Every threshold that applies to each design: the scenario's for it (`declared`, by design name),
    then the command line's for every design or for it, then the defaults those leave open."""
    out = []
    base = group(baseline) if baseline is not None else None
    for name, design_runs in group(runs).items():
        design = design_runs[0].design
        explicit = [*declared.get(design, ()), *(t for t in given if t.design in (None, design, name))]
        # A rule given twice (in the scenario and with -t) is one threshold: one line, one result.
        unique: dict[str, Threshold] = {}
        for t in explicit:
            unique.setdefault(t.rule(), t)  # the first of each, in order
        explicit = list(unique.values())
        network = any(run.network_faults for run in design_runs)
        for t in [*explicit, *defaults(explicit, network)]:
            base_runs = None if base is None else base.get(name, [])
            out.append(evaluate(t, name, design_runs, base_runs))
    return out


def check_targets(
    run_names: Sequence[str],
    scenario_designs: Sequence[str],
    declared: dict[str, Sequence[Threshold]],
    given: Sequence[Threshold],
) -> None:
    """Raise UsageError when a threshold names a design it can never apply to: a typo would otherwise
    leave that design unchecked, or quietly check nothing. `run_names`: the designs and sweep labels
    of the run. A scenario's [expect.X] may also name one of the scenario's own designs, so running
    one design of a scenario that declares several is fine."""
    in_run = list(dict.fromkeys(run_names))
    bad = [f"--threshold {str(t)!r}" for t in given if t.design is not None and t.design not in in_run]
    bad += [f"[expect.{d}] in the scenario" for d in declared if d not in in_run and d not in scenario_designs]
    if not bad:
        return
    lines = "\n".join(f"  - {b}" for b in bad)
    also = [d for d in scenario_designs if d not in in_run]
    designs = ", ".join(in_run) + (f" (and the scenario's {', '.join(also)})" if also else "")
    raise UsageError(
        f"{len(bad)} threshold(s) name a design that is not in this run:\n{lines}\ndesigns: {designs}",
        hint="check the spelling; a threshold for every design needs no DESIGN: prefix",
    )


def unchecked(result: Result) -> list[str]:
    """Labels (designs, sweep values) of the result to which no threshold applied."""
    checked = {t.design for t in result.thresholds}
    return [name for name in group(result.runs) if name not in checked]


def coverage(result: Result) -> dict[str, str]:
    """Per label, how many thresholds were evaluated and how they came out: "6 thresholds, all met",
    "6 thresholds, 1 violated, 1 inconclusive", "no threshold applied"."""
    out = {}
    for name in group(result.runs):
        mine = [t for t in result.thresholds if t.design == name]
        if not mine:
            out[name] = "no threshold applied"
            continue
        failed = sum(t.status == "fail" for t in mine)
        unsure = sum(t.status == "inconclusive" for t in mine)
        parts = [f"{failed} violated"] if failed else []
        parts += [f"{unsure} inconclusive"] if unsure else []
        noun = "threshold" if len(mine) == 1 else "thresholds"
        out[name] = f"{len(mine)} {noun}, " + (", ".join(parts) if parts else "all met")
    return out


def count_evaluated(result: Result) -> None:
    """Record on each run how many thresholds its label was checked against (DesignRun.thresholds_evaluated)."""
    for run in result.runs:
        run.thresholds_evaluated = sum(t.design == label(run) for t in result.thresholds)
