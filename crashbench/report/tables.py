"""The report's tables: counts per run (in the terminal table's order), thresholds with ✓ / ✗, the
scenario and the environment. The rows are crashbench.report.rows, as in the terminal table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashbench.model.faults import broker_fault_text
from crashbench.model.results import DesignRun, Result, ThresholdResult, number
from crashbench.model.results import label as label_of
from crashbench.model.spec import Scenario
from crashbench.report import rows as table_rows
from crashbench.report.svg import esc

# The terminal table's rows, then the kills: the page has no separate faults table. A leading "  "
# marks a row that breaks down the one above it; a run that never ran again is an alarm here too.
ROWS: tuple[tuple[str, str], ...] = (*table_rows.ROWS, ("kills", "kills"), ("  mid-job", "kills_mid_job"))
ALARM = table_rows.ALARM | {"unrecovered"}
MARK = {"pass": "✓", "fail": "✗", "inconclusive": "?"}


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return "never" if math.isinf(v) else f"{v:.0f} ms"


TIMINGS: tuple[tuple[str, Callable[[DesignRun], str]], ...] = (
    ("wall time", lambda r: f"{r.timings.wall_s:.2f} s"),
    ("  × ideal", lambda r: f"{r.timings.ratio_to_ideal:.2f}×"),
    ("jobs/s", lambda r: f"{r.timings.jobs_per_s:,.0f}"),
    ("recovery p50", lambda r: _ms(r.timings.recovery_ms_p50)),
    ("recovery p95", lambda r: _ms(r.timings.recovery_ms_p95)),
    ("recovery max", lambda r: _ms(r.timings.recovery_ms_max)),
    ("kill → new worker ready", lambda r: _ms(r.timings.restart_ms_median)),
)


def _failed_metrics(result: Result, name: str) -> set[str]:
    return {t.threshold.split(" ")[0].split(".")[0] for t in result.thresholds if t.design == name and not t.met}


def _row_label(text: str) -> tuple[str, str]:
    return ("sub", text.strip()) if text.startswith("  ") else ("", text)


def counts(result: Result) -> str:
    """Counts per run, one column each (repeats too: the page draws each run of them)."""
    runs = result.runs
    heads = "".join(f"<th>{esc(label_of(r))}{f' #{r.repeat + 1}' if result.repeat > 1 else ''}</th>" for r in runs)
    out = [f'<table class="counts"><thead><tr><th></th>{heads}</tr></thead><tbody>']
    failed = {label_of(r): _failed_metrics(result, label_of(r)) for r in runs}
    for text, key in ROWS:
        if not table_rows.shown(key, runs):
            continue
        cls, shown = _row_label(text)
        cells = []
        for i, r in enumerate(runs):
            v = getattr(r.counts, key)
            bad = key in failed[label_of(r)]
            style = "failed" if bad else ("alarm" if v and key in ALARM else "")
            cells.append(f'<td class="{style}" data-run="{i}" data-count="{key}">{number(v)}{" ✗" if bad else ""}</td>')
        row_cls = "sub" if cls else ("section" if key == "kills" else "")
        out.append(f'<tr class="{row_cls}"><td>{esc(shown)}</td>{"".join(cells)}</tr>')
    for n, (text, fn) in enumerate(TIMINGS):
        cls, shown = _row_label(text)
        row_cls = "section" if n == 0 else cls
        out.append(f'<tr class="{row_cls}"><td>{esc(shown)}</td>{"".join(f"<td>{esc(fn(r))}</td>" for r in runs)}</tr>')
    out.append("</tbody></table>")
    return "".join(out)


def thresholds(result: Result) -> str:
    """Every threshold against every design in one grid: a row per threshold as written, a column per
    design (or sweep value), each cell its mark and the value checked; the detail in its tooltip."""
    names = list(dict.fromkeys(label_of(r) for r in result.runs))
    if not result.thresholds:
        return '<div><h3>Thresholds</h3><p class="sub">No threshold applied.</p></div>'
    by: dict[tuple[str, str], ThresholdResult] = {(t.threshold, t.design): t for t in result.thresholds}
    rows = list(dict.fromkeys(t.threshold for t in result.thresholds))
    heads = "".join(f"<th>{esc(n)}</th>" for n in names)
    out = [f'<div><h3>Thresholds</h3><table class="thresholds"><thead><tr><th></th>{heads}</tr></thead><tbody>']
    for text in rows:
        cells = []
        for n in names:
            t = by.get((text, n))
            if t is None:
                cells.append("<td></td>")
                continue
            got = "-" if t.actual is None else number(t.actual)
            tip = f"{t.status}: {table_rows.threshold_detail(t)} (from {t.source})"
            cells.append(
                f'<td class="mark {t.status}" title="{esc(tip)}">{MARK[t.status]} <span>{esc(got)}</span></td>'
            )
        out.append(f"<tr><td><code>{esc(text)}</code></td>{''.join(cells)}</tr>")
    met = "".join(
        f"<td>{sum(t.met for t in mine)} of {len(mine)} met</td>"
        for mine in ([t for t in result.thresholds if t.design == n] for n in names)
    )
    out.append(f'<tr class="section"><td></td>{met}</tr></tbody></table></div>')
    return "".join(out)


def scenario_line(sc: dict[str, Any]) -> str:
    """The scenario in one line, as the terminal table's title says it."""
    try:
        line = (
            f"{sc['name']}: {sc['jobs']:,} jobs × {sc['job_ms']:g} ms, {sc['workers']} workers, "
            f"{table_rows.kills_phrase(sc)}, seed {sc['seed']}"
        )
    except (KeyError, TypeError, ValueError):
        return str(sc.get("name", "scenario"))
    if sc.get("fault", "none") != "none":
        line += f"; {broker_fault_text(sc['fault'])} at {sc.get('fault_at', 0):g} s for {sc.get('downtime', 0):g} s"
    return line


def _dl(title: str, items: list[tuple[str, object]]) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items if v not in (None, "", {}, []))
    return f"<div><h3>{esc(title)}</h3><dl>{rows}</dl></div>"


def scenario(sc: dict[str, Any]) -> str:
    """The settings that differ from the defaults first; the rest folded. File names, never the
    absolute paths of the machine that ran it (a report is shared)."""
    skip = {"expect", "description", "designs", "name", "source"}
    defaults = Scenario().to_dict()
    items = [(k, v) for k, v in sc.items() if k not in skip and not isinstance(v, dict | list)]
    changed = [(k, v) for k, v in items if defaults.get(k) != v]
    same = [(k, v) for k, v in items if defaults.get(k) == v]
    head: list[tuple[str, object]] = [("name", sc.get("name")), ("description", sc.get("description"))]
    if sc.get("source"):
        head.append(("file", Path(str(sc["source"])).name))
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in same if v not in (None, "", {}, []))
    folded = f"<details><summary>{len(same)} settings at their defaults</summary><dl>{rows}</dl></details>"
    return _dl("Scenario", [*head, *changed])[: -len("</div>")] + (folded if same else "") + "</div>"


def environment(result: Result) -> str:
    env = dataclasses.asdict(result.environment)
    libraries = env.pop("libraries", {}) or {}
    pythons = env.pop("library_pythons", {}) or {}
    for key in ("server_binary", "worker_python"):  # the program's name, not where it sat on that machine
        if env.get(key):
            env[key] = Path(env[key]).name
    items = [(k.replace("_", " "), v) for k, v in env.items()]
    items += [(f"library {k}", v) for k, v in libraries.items()]
    items += [(f"worker python for {k}", Path(v).name) for k, v in pythons.items()]
    return _dl("Environment", items)
