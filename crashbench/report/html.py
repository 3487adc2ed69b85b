"""The HTML report of a result: one self-contained file (inline SVG and CSS, no script, nothing fetched)
that a browser opens from disk or a CI artifact store. Per run: the lanes (crashbench.report.lanes)
and the queue beneath them on the time axis all runs share; then the counts, thresholds, scenario
and environment (crashbench.report.tables)."""

from __future__ import annotations

import statistics
from pathlib import Path

from crashbench.faults import registry
from crashbench.model.counts import Counts
from crashbench.model.results import DesignRun, Result
from crashbench.model.results import label as label_of
from crashbench.model.timeline import Timeline
from crashbench.report import lanes, tables
from crashbench.report.rows import effect_note
from crashbench.report.svg import XMLNS, Scale, axis, depth_panel, esc, fmt_count, num, rate_panel, time_span

WIDTH = 1200  # the viewBox width of every chart; the page scales them to the window
LEFT, RIGHT = 118, 24
QUEUE_H, RATE_H = 78, 46

CSS = """
:root{--ink:#1d2129;--muted:#5f6670;--line:#d9dde3;--bg:#fff;--soft:#f5f6f8;--bad:#b00020;--good:#1a7f37;
--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;padding:24px 32px 48px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",
Arial,sans-serif;color:var(--ink);background:var(--bg);max-width:1500px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:0}h3{font-size:14px;margin:16px 0 6px}
.sub{color:var(--muted);margin:0 0 12px}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:600;
vertical-align:middle;margin-left:8px;color:#fff;background:var(--muted)}
.badge.pass{background:var(--good)}.badge.fail,.badge.broken{background:var(--bad)}
.badge.inconclusive{background:var(--warn)}
.legend{display:flex;flex-wrap:wrap;gap:4px 18px;padding:8px 12px;background:var(--soft);border-radius:6px;
font-size:12.5px;position:sticky;top:0;z-index:1;border:1px solid var(--line)}
.legend span{display:inline-flex;align-items:center;gap:6px;white-space:nowrap}
.run{border-top:1px solid var(--line);margin-top:22px;padding-top:14px}
.headline{margin:4px 0 6px;font-size:14.5px}.headline .bad{color:var(--bad);font-weight:600}
.headline .good{color:var(--good);font-weight:600}
.note{background:#fff8e1;border-left:4px solid #e0a800;padding:6px 10px;margin:6px 0;font-size:13px}
svg.chart{width:100%;height:auto;display:block}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;font-size:13px}
th,td{padding:3px 10px;border-bottom:1px solid var(--line);text-align:right}
th:first-child,td:first-child{text-align:left}
thead th{border-bottom:2px solid var(--ink)}
td.alarm{color:var(--warn);font-weight:600}td.failed{color:var(--bad);font-weight:700}
tr.sub td:first-child{padding-left:24px;color:var(--muted)}
tr.section td{border-top:2px solid var(--line)}
.thresholds td.mark{font-weight:700;text-align:right;white-space:nowrap}.thresholds td.mark span{font-weight:400;
color:var(--ink);display:inline-block;min-width:3.2em}.thresholds code{font-size:12px}
.mark.pass{color:var(--good)}.mark.fail{color:var(--bad);background:#fdecee}.mark.inconclusive{color:var(--warn)}
.cols{display:flex;flex-wrap:wrap;gap:12px 40px;align-items:flex-start}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:0;font-size:13px}
dt{color:var(--muted)}dd{margin:0;font-variant-numeric:tabular-nums}
footer{margin-top:28px;color:var(--muted);font-size:12px}
/* the charts' own classes */
.lane{fill:#f0f2f5}.lane-label{fill:#3b414a;font-size:11px}.worker{fill:#8a919b;font-size:9.5px}
.x.done{fill:#4e79a7}.x.again{fill:#f28e2b}.x.failed{fill:#7b3294}.x.interrupted{fill:#d62728}
.density{fill:#4e79a7}
.fault line{stroke-width:2}.fault path{stroke-width:2.2;fill:none}
.band rect{fill:#f4a6a6;fill-opacity:.35;stroke:#d04040;stroke-dasharray:4 3}.band-label{fill:#a01010;font-size:11px}
.event line{stroke:#6b7280;stroke-dasharray:3 3}.event text,.event-label{fill:#4b5563;font-size:10.5px}
.recovery path{stroke:#1a9850;stroke-width:1.6;fill:none}
.recovery text{fill:#116b37;font-size:10.5px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px}
.unrecovered circle{fill:#b00020}.unrecovered path{stroke:#fff;stroke-width:1.6}
.unrecovered text{fill:#b00020;font-size:10.5px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px}
.pass-label{fill:#5f6670;font-size:10px}.pass{stroke:#9aa1ab;stroke-width:1}.pass.gave{stroke:#1a9850;stroke-width:2}
.panel{fill:none;stroke:#e3e6ea}.grid{stroke:#eceef1}.axis{stroke:#6b7280}
.tick,.ylab{fill:#5f6670;font-size:10.5px}.panel-title{fill:#3b414a;font-size:11px}
.depth-area{fill-opacity:.28}.depth-line{fill:none;stroke-width:1.6}.rate{fill:#7aa6d6}
.key{fill:#3b414a;font-size:10.5px}.empty{fill:#8a919b;font-size:11px}
"""

LEGEND = (  # (swatch markup inside a 26x14 box, text)
    ('<rect y="3" width="26" height="9" fill="#4e79a7"/>', "done"),
    ('<rect y="3" width="26" height="9" fill="#f28e2b"/>', "ran again (a re-run)"),
    ('<rect y="3" width="26" height="9" fill="#7b3294"/>', "raised"),
    ('<rect x="9" y="3" width="5" height="9" fill="#d62728"/>', "interrupted (worker died inside)"),
    ('<path d="M8 2l10 10m0-10l-10 10" stroke="#b00020" stroke-width="2.2"/>', "SIGKILL"),
    ('<path d="M8 2l10 10m0-10l-10 10" stroke="#e66100" stroke-width="2.2"/>', "SIGTERM"),
    ('<path d="M8 2l10 10m0-10l-10 10" stroke="#6a3d9a" stroke-width="2.2"/>', "pause (SIGSTOP)"),
    (
        '<path d="M2 12C2 1 22 1 22 10" stroke="#1a9850" stroke-width="1.6" fill="none"/>'
        '<path d="M19 8l3 4 3-4z" fill="#1a9850"/>',
        "fault → the hit job's next start",
    ),
    (
        '<circle cx="13" cy="7" r="5.5" fill="#b00020"/><path d="M10.5 4.5l5 5m0-5l-5 5" stroke="#fff"/>',
        "hit job never ran again",
    ),
    (
        '<rect x="1" y="1" width="24" height="12" fill="#f4a6a6" fill-opacity=".5" stroke="#d04040" '
        'stroke-dasharray="4 3"/>',
        "broker down",
    ),
    ('<path d="M8 3v9M18 3v6" stroke="#1a9850" stroke-width="2"/>', "recovery pass (tall: gave jobs back)"),
)


def _legend(aggregated: bool) -> str:
    items = list(LEGEND)
    if aggregated:
        items.append(('<rect width="8" height="14" fill="#4e79a7" fill-opacity=".2"/><rect x="9" width="8" '
                      'height="14" fill="#4e79a7" fill-opacity=".6"/><rect x="18" width="8" height="14" '
                      'fill="#4e79a7"/>', "busy fraction (aggregated runs)"))  # fmt: skip
    spans = "".join(
        f'<span><svg width="26" height="14" viewBox="0 0 26 14">{sw}</svg>{esc(t)}</span>' for sw, t in items
    )
    return f'<div class="legend">{spans}</div>'


def _design_status(result: Result, name: str) -> str:
    mine = [t for t in result.thresholds if t.design == name]
    if not mine:
        return "unchecked"
    for status in ("fail", "inconclusive"):
        if any(t.status == status for t in mine):
            return status
    return "pass"


def _ms_range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.0f} ms" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} ms (median {statistics.median(values):.0f})"
    )


def headline(c: Counts, drawn: lanes.Lanes, others: int = 0) -> str:
    """One sentence a reader gets the run from without reading the chart."""
    parts = []
    if c.enqueued and c.done == c.enqueued:
        parts.append(f'<span class="good">all {c.enqueued:,} jobs done</span>')
    else:
        parts.append(f"{c.done:,} of {c.enqueued:,} jobs done")
    for key, word in (("lost", "lost"), ("stranded", "stranded"), ("dead_lettered", "dead-lettered"),
                      ("failed", "failed"), ("duplicated", "done twice or more"),
                      ("effect_missing", "effects missing (your check)"),
                      ("effect_duplicated", "effects duplicated (your check)")):  # fmt: skip
        if getattr(c, key):
            parts.append(f'<span class="bad">{getattr(c, key):,} {word}</span>')
    n = c.kills + others  # `others`: the other families' faults (the broker's, the network's, a host's, ...)
    faults = f"{n} fault{'s' if n != 1 else ''}"
    if c.kills:
        faults += f" ({c.kills} on workers, {c.kills_mid_job} mid-job)" if others else f" ({c.kills_mid_job} mid-job)"
    parts.append(faults)
    if drawn.recoveries:
        parts.append(f"hit jobs started again after {_ms_range(drawn.recoveries)}")
    if drawn.unrecovered:
        parts.append(f'<span class="bad">{len(drawn.unrecovered)} hit job'
                     f'{"s" if len(drawn.unrecovered) != 1 else ""} never ran again</span>')  # fmt: skip
    return " · ".join(parts)


def chart(tl: Timeline, scale: Scale, index: int) -> tuple[str, lanes.Lanes]:
    """One run's figure: the lanes, the queue depth, completions per second, and the time axis."""
    arrow = f"arrow{index}"
    drawn = lanes.draw(tl, scale, 8.0, arrow)
    y = 8.0 + drawn.height + 10
    queue = depth_panel(tl, scale, y, QUEUE_H)
    y += QUEUE_H + 8
    rate = rate_panel(tl, scale, y, RATE_H)
    y += RATE_H
    height = y + 22
    svg = (
        f'<svg class="chart" xmlns="{XMLNS}" viewBox="0 0 {WIDTH} {num(height)}" role="img" '
        f'aria-label="timeline of {esc(tl.variant or tl.spec)}"><defs><marker id="{arrow}" viewBox="0 0 8 8" '
        'refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto"><path d="M0 0L8 4L0 8z" '
        'fill="#1a9850"/></marker></defs>'
        f"{drawn.svg}{queue}{rate}{axis(scale, y)}</svg>"
    )
    return svg, drawn


def _section(result: Result, run: DesignRun | None, tl: Timeline, scale: Scale, index: int) -> str:
    name = label_of(run) if run is not None else tl.variant or tl.spec
    svg, drawn = chart(tl, scale, index)
    status = _design_status(result, name)
    repeat = f" · repeat {run.repeat + 1}" if run is not None and result.repeat > 1 else ""
    design = f' <span class="sub">({esc(run.design)})</span>' if run is not None and run.variant else ""
    out = [
        f'<section class="run" data-design="{esc(name)}" data-index="{index}">',
        f'<h2>{esc(name)}{design}{repeat}<span class="badge {status}">{status}</span></h2>',
    ]
    if run is not None:
        others = sum(1 for f in run.schedule if f.kind != "signal")  # every family's planned faults but the kills
        out.append(f'<p class="headline">{headline(run.counts, drawn, others)}</p>')
    if drawn.aggregated:
        bucket = (scale.t1 - scale.t0) / max(20, int((scale.x1 - scale.x0) / 4))
        out.append(
            f'<p class="note aggregated">{len(tl.executions):,} executions: drawn aggregated, as the busy fraction of '
            f"each lane per {bucket * 1000:.3g} ms (darker is busier), not as one bar per execution (above "
            f"{lanes.AGGREGATE_ABOVE:,}). Faults, recoveries and the counts are exact.</p>"
        )
    if drawn.unplaced:
        out.append(f'<p class="note">{drawn.unplaced:,} executions by workers no spawn record names are not drawn.</p>')
    if tl.warnings:
        out += [f'<p class="note">{esc(w)}</p>' for w in tl.warnings]
    if run is not None and (note := effect_note(run)):
        out.append(f'<p class="note">{esc(note)}</p>')
    out.append(svg)
    out.append("</section>")
    return "".join(out)


def render(result: Result, timelines: list[Timeline], source: str = "") -> str:
    """The whole page. timelines[i] belongs to result.runs[i]."""
    t0, t1 = time_span(timelines)
    scale = Scale(t0, t1, LEFT, WIDTH - RIGHT)
    sc = result.scenario
    aggregated = any(len(tl.executions) > lanes.AGGREGATE_ABOVE for tl in timelines)
    names = ", ".join(dict.fromkeys([label_of(r) for r in result.runs] or [tl.variant or tl.spec for tl in timelines]))
    title = f"crashbench {result.kind}: {sc.get('name', '')} — {names}"
    sections = [
        _section(result, result.runs[i] if i < len(result.runs) else None, tl, scale, i)
        for i, tl in enumerate(timelines)
    ]
    total = sum(len(tl.executions) for tl in timelines)
    family_css = "".join(f"\n{f.css}" for f in registry.FAMILIES if f.css)  # each family styles its own marks
    return "".join([
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}{family_css}</style></head><body>",
        f'<h1>{esc(title)}<span class="badge {result.status}">{esc(result.status)}</span></h1>',
        f'<p class="sub">{esc(tables.scenario_line(sc))}<br>result {esc(result.id)} · {esc(result.created)}'
        f"{' · ' + esc(source) if source else ''} · {fmt_count(total)} executions drawn on one clock "
        "(0 = workers started)</p>",
        _legend(aggregated),
        '<div class="cols">',
        f"<div><h3>Counts</h3>{tables.counts(result)}</div>" if result.runs else "",
        tables.thresholds(result),
        "</div>",
        *sections,
        '<div class="cols">',
        tables.scenario(sc),
        tables.environment(result),
        "</div>",
        f"<footer>crashbench {esc(result.environment.crashbench)} · self-contained: no script, nothing fetched"
        "</footer></body></html>\n",
    ])  # fmt: skip


def write(result: Result, timelines: list[Timeline], path: Path) -> Path:
    path.write_text(render(result, timelines), encoding="utf-8")
    return path
