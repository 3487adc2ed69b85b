"""SVG building blocks of the report: the time scale every chart of a report shares, the time axis,
the queue-depth and completions panels, and `depth_chart`, a small standalone SVG for a Markdown
summary to link. Plain strings: a report is written once, and string joins keep a large one fast."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

from crashbench.model.timeline import Timeline

XMLNS = "http://www.w3.org/2000/svg"
# One colour per design in charts that overlay the runs (depth_chart): distinct in print and for
# the common colour-vision deficiencies (Okabe-Ito).
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")
DEPTH_SERIES = (  # (field, label, colour)
    ("pending", "pending", "#5b8fd6"),
    ("inflight", "in flight", "#1b3a6b"),
    ("delayed", "delayed", "#c08a00"),
    ("dead", "dead-lettered", "#b3261e"),
)


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def num(v: float) -> str:
    """A coordinate with one decimal: a tenth of a pixel is below what a screen shows, and every
    byte counts when a run has 20,000 bars."""
    r = round(v, 1)
    return str(int(r)) if r == int(r) else str(r)


@dataclass(frozen=True, slots=True)
class Scale:
    """Run-clock seconds to x pixels; every chart of one report uses the same one, so the designs
    line up one above the other."""

    t0: float
    t1: float
    x0: float
    x1: float

    def x(self, t: float) -> float:
        span = self.t1 - self.t0 or 1.0
        return self.x0 + (min(max(t, self.t0), self.t1) - self.t0) / span * (self.x1 - self.x0)

    @property
    def px_per_s(self) -> float:
        return (self.x1 - self.x0) / ((self.t1 - self.t0) or 1.0)


def time_span(timelines: Iterable[Timeline]) -> tuple[float, float]:
    """From the workers' start to the last thing any run recorded. Enqueues before the start are
    left out: filling a queue of a million jobs can take longer than the run itself."""
    end = 0.0
    for tl in timelines:
        end = max(end, tl.drained_at, tl.faults_end)
        if tl.executions:
            end = max(end, max(ex.end if ex.end is not None else ex.start for ex in tl.executions))
        if tl.depth:
            end = max(end, tl.depth[-1].t)
        if tl.broker_fault is not None and tl.broker_fault.back_at is not None:
            end = max(end, tl.broker_fault.back_at)
    return 0.0, end if end > 0 else 1.0


def nice_step(span: float, target: int) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def ticks(lo: float, hi: float, target: int = 8) -> list[float]:
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step) * step
    n = int((hi - first) / step + 1e-9) + 1
    return [round(first + i * step, 9) for i in range(max(n, 0))]


def fmt_s(t: float) -> str:
    return f"{t:g} s" if abs(t) >= 1 or t == 0 else f"{t * 1000:g} ms"


def fmt_count(v: float) -> str:
    if v >= 1_000_000:
        return f"{v / 1_000_000:.3g}M"
    if v >= 10_000:
        return f"{v / 1000:.3g}k"
    return f"{v:.0f}"


def grid(scale: Scale, y0: float, y1: float) -> str:
    """Vertical grid lines at the axis ticks, behind a panel."""
    return "".join(
        f'<line class="grid" x1="{num(scale.x(t))}" x2="{num(scale.x(t))}" y1="{num(y0)}" y2="{num(y1)}"/>'
        for t in ticks(scale.t0, scale.t1)
    )


def axis(scale: Scale, y: float) -> str:
    """The time axis: a rule at `y` and labelled ticks below it."""
    out = [f'<line class="axis" x1="{num(scale.x0)}" x2="{num(scale.x1)}" y1="{num(y)}" y2="{num(y)}"/>']
    for t in ticks(scale.t0, scale.t1):
        x = num(scale.x(t))
        out.append(f'<line class="axis" x1="{x}" x2="{x}" y1="{num(y)}" y2="{num(y + 4)}"/>')
        out.append(f'<text class="tick" x="{x}" y="{num(y + 15)}" text-anchor="middle">{fmt_s(t)}</text>')
    return "".join(out)


def _steps(points: Sequence[tuple[float, float]], scale: Scale, y: float, h: float, top: float) -> str:
    """A step line's path data: a depth reading holds until the next one."""
    if not points:
        return ""
    # One step per pixel column at most (the last reading in it): a long run read every 0.25 s has
    # more readings than the chart has pixels.
    cols: dict[int, float] = {}
    for t, v in points:
        cols[round(scale.x(t))] = v
    parts = []
    for n, (px, v) in enumerate(cols.items()):
        py = num(y + h - (v / top) * h if top else y + h)
        parts.append(f"M{px} {py}" if n == 0 else f"H{px}V{py}")
    return "".join(parts)


def _unbroken(
    pts: list[tuple[float, float]], end: float, outage: tuple[float, float] | None
) -> list[list[tuple[float, float]]]:
    """The readings as step lines that each hold to their next reading, broken by a broker outage:
    the last reading before it holds until the fault struck, nothing is drawn until the server
    answered again (nobody could read the queue: a held value would be made up), the first after it
    starts again. Without an outage, one line to `end`."""
    if outage is None:
        return [[*pts, (end, pts[-1][1])]]
    struck, back = outage
    before = [p for p in pts if p[0] <= struck]
    after = [p for p in pts if p[0] >= back and p[0] > struck]
    parts = []
    if before:
        parts.append([*before, (min(struck, end), before[-1][1])])
    if after:
        parts.append([*after, (max(end, after[-1][0]), after[-1][1])])
    return parts


def depth_panel(tl: Timeline, scale: Scale, y: float, h: float) -> str:
    """Queue depth over time: pending as an area (it dwarfs the rest), the others as step lines. Each
    series names its maximum in the legend, so a line flat on the floor still says what it held."""
    out = [grid(scale, y, y + h), f'<rect class="panel" x="{num(scale.x0)}" y="{num(y)}" '
           f'width="{num(scale.x1 - scale.x0)}" height="{num(h)}"/>']  # fmt: skip
    if not tl.depth:
        out.append(f'<text class="empty" x="{num(scale.x0 + 8)}" y="{num(y + h / 2 + 4)}">no depth readings</text>')
        return "".join(out)
    # The axis's maximum is the data's: each series is drawn on its own (none stacked on another).
    top = max(max(d.pending, d.inflight, d.delayed, d.dead) for d in tl.depth) or 1
    end = max(scale.t1 if tl.drained_at <= 0 else min(tl.drained_at, scale.t1), tl.depth[-1].t)
    legend_x = scale.x0 + 8
    for name, label, colour in DEPTH_SERIES:
        pts = [(d.t, float(getattr(d, name))) for d in tl.depth]
        peak = max(v for _, v in pts)
        if name != "pending" and peak == 0:
            continue
        for part in _unbroken(pts, end, tl.fault_window()):
            path = _steps(part, scale, y, h, top)
            if name == "pending":
                base = num(y + h)
                first = num(scale.x(part[0][0]))
                out.append(f'<path class="depth-area" d="{path}V{base}H{first}Z" fill="{colour}"/>')
            else:
                out.append(f'<path class="depth-line" d="{path}" stroke="{colour}"/>')
        text = f"{label} (max {fmt_count(peak)})"
        out.append(f'<rect x="{num(legend_x)}" y="{num(y + 6)}" width="9" height="9" fill="{colour}"/>'
                   f'<text class="key" x="{num(legend_x + 13)}" y="{num(y + 14)}">{esc(text)}</text>')  # fmt: skip
        legend_x += 22 + 6.2 * len(text)
    out.append(f'<text class="ylab" x="{num(scale.x0 - 6)}" y="{num(y + 9)}" text-anchor="end">{fmt_count(top)}</text>')
    out.append(f'<text class="ylab" x="{num(scale.x0 - 6)}" y="{num(y + h)}" text-anchor="end">0</text>')
    out.append(f'<text class="panel-title" x="{num(scale.x0 - 6)}" y="{num(y + h / 2 + 4)}" '
               f'text-anchor="end">queue</text>')  # fmt: skip
    return "".join(out)


def completion_rate(tl: Timeline, t0: float, t1: float, buckets: int) -> tuple[float, list[int]]:
    """Completions per bucket of (t1 - t0) / buckets seconds."""
    width = (t1 - t0) / buckets or 1.0
    counts = [0] * buckets
    for ex in tl.executions:
        if ex.end is not None and not ex.failed and t0 <= ex.end < t1:
            counts[int((ex.end - t0) / width)] += 1
    return width, counts


def rate_panel(tl: Timeline, scale: Scale, y: float, h: float) -> str:
    """Completions per second as columns: a stall after a kill, or a broker fault, shows as a gap."""
    # About 25 completions a bucket on average: fewer, and buckets of equal work alias into a comb.
    done = sum(1 for ex in tl.executions if ex.end is not None and not ex.failed)
    buckets = max(10, min(150, done // 25))
    width, counts = completion_rate(tl, scale.t0, scale.t1, buckets)
    rates = [c / width for c in counts]
    top = max(rates) if rates and max(rates) > 0 else 1.0
    bw = (scale.x1 - scale.x0) / buckets
    out = [grid(scale, y, y + h), f'<rect class="panel" x="{num(scale.x0)}" y="{num(y)}" '
           f'width="{num(scale.x1 - scale.x0)}" height="{num(h)}"/>']  # fmt: skip
    for i, r in enumerate(rates):
        if r <= 0:
            continue
        bh = r / top * h
        t = scale.t0 + i * width
        out.append(f'<rect class="rate" x="{num(scale.x0 + i * bw)}" y="{num(y + h - bh)}" width="{num(bw)}" '
                   f'height="{num(bh)}"><title>{fmt_s(round(t, 3))}: {r:.0f} jobs/s</title></rect>')  # fmt: skip
    out.append(f'<text class="ylab" x="{num(scale.x0 - 6)}" y="{num(y + 9)}" text-anchor="end">{fmt_count(top)}/s'
               f'</text><text class="ylab" x="{num(scale.x0 - 6)}" y="{num(y + h)}" text-anchor="end">0</text>'
               f'<text class="panel-title" x="{num(scale.x0 - 6)}" y="{num(y + h / 2 + 4)}" text-anchor="end">'
               f"done/s</text>")  # fmt: skip
    return "".join(out)


def depth_chart(timelines: list[Timeline], width: int = 640, height: int = 160) -> str:
    """A standalone SVG file's text: pending + in flight over time, one line per run, on one axis."""
    left, right, top_pad, bottom = 48, 12, 22, 22
    t0, t1 = time_span(timelines)
    scale = Scale(t0, t1, left, width - right)
    h = height - top_pad - bottom
    peak = max((d.pending + d.inflight for tl in timelines for d in tl.depth), default=0) or 1
    out = [
        f'<svg xmlns="{XMLNS}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif" font-size="11">',
        "<style>.grid{stroke:#e3e6ea}.axis{stroke:#666}.tick,.ylab{fill:#555}</style>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        grid(scale, top_pad, top_pad + h),
        axis(scale, top_pad + h),
        f'<text class="ylab" x="{left - 5}" y="{top_pad + 8}" text-anchor="end">{fmt_count(peak)}</text>',
        f'<text class="ylab" x="{left - 5}" y="{top_pad + h}" text-anchor="end">0</text>',
    ]
    legend_x = float(left)
    for i, tl in enumerate(timelines):
        colour = PALETTE[i % len(PALETTE)]
        name = tl.variant or tl.spec
        if tl.depth:
            pts = [(d.t, float(d.pending + d.inflight)) for d in tl.depth]
            parts = _unbroken(pts, max(tl.drained_at, pts[-1][0]), tl.fault_window())
            path = "".join(_steps(part, scale, top_pad, h, peak) for part in parts)  # each part starts with M
            out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.8"><title>{esc(name)}'
                       "</title></path>")  # fmt: skip
        out.append(f'<rect x="{num(legend_x)}" y="6" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{num(legend_x + 14)}" y="15">{esc(name)}</text>')  # fmt: skip
        legend_x += 26 + 6.5 * len(name)
    out.append(f'<text x="{width - right}" y="15" text-anchor="end" fill="#555">queue depth (pending + in flight)'
               "</text></svg>\n")  # fmt: skip
    return "".join(out)
