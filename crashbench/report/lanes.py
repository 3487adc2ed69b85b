"""The lanes of one run: a lane per worker slot (a slot gets a new worker after each kill) with every
execution as a bar, each fault as its family draws it (crashbench.faults.family: marks on the lane a
fault hit, bands over the lanes or across them all), and a line from each worker fault to the next
start of every job it hit (or a mark where that never came).

Above AGGREGATE_ABOVE executions a run is drawn as a heat strip per lane (the busy fraction per time
bucket) instead: a million bars would make a page no browser opens quickly, and no eye reads them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from crashbench.faults import registry
from crashbench.model.faults import SignalRecord
from crashbench.model.ledger import Execution
from crashbench.model.timeline import Timeline
from crashbench.report.svg import Scale, esc, num

AGGREGATE_ABOVE = 20_000
MAX_SUBROWS = 6  # a lane running several handlers at once (threads, a pool) splits into at most this many rows
KIND_TEXT = {"done": "", "again": " (ran again)", "failed": " (raised)", "interrupted": " (killed inside)"}
# Marks drawn as a vertical line across the lanes, with their label.
EVENTS = {
    "drain": "faults end", "replica_cut": "replica cut", "failover": "failover", "healed": "cut healed",
}  # fmt: skip
EVENT_GAP = 70  # px: events closer than this share one label


@dataclass(slots=True)
class Lanes:
    """What was drawn, besides the markup: the page states these figures beside the chart."""

    svg: str
    height: float
    aggregated: bool
    recoveries: list[float] = field(default_factory=list)  # ms, one per hit job that started again
    unrecovered: list[str] = field(default_factory=list)  # hit jobs that never started again
    unplaced: int = 0  # executions by a worker no spawn names (no lane to put them on)


@dataclass(frozen=True, slots=True)
class Geometry:
    top: float  # y of the first lane's gutter
    lane_h: float
    gap: float  # the gutter above each lane: worker names, never-recovered marks
    slots: int

    def y(self, slot: int) -> float:
        return self.top + slot * (self.lane_h + self.gap) + self.gap

    def mid(self, slot: int) -> float:
        return self.y(slot) + self.lane_h / 2

    @property
    def bottom(self) -> float:
        return self.y(self.slots - 1) + self.lane_h


def geometry(slots: int, top: float) -> Geometry:
    if slots <= 8:
        return Geometry(top, 22.0, 16.0, slots)
    lane_h = max(3.0, min(14.0, 240.0 / slots))
    return Geometry(top, lane_h, 2.0 if slots > 24 else 6.0, slots)


def slot_count(tl: Timeline) -> int:
    return max([int(tl.scenario.get("workers", 0) or 0), *(s.slot + 1 for s in tl.spawns)]) or 1


def deaths(tl: Timeline) -> dict[str, float]:
    """When each killed worker died: the end of the bar of a handler it died inside."""
    return {k.worker: k.at for k in tl.signals if k.signal != "SIGSTOP"}


def classify(executions: Sequence[Execution]) -> list[tuple[Execution, str]]:
    """Each execution with its kind, in start order: `again` is a completed execution of a job that
    had started before (a re-run: after a kill, a lost ack, a stolen lease)."""
    seen: set[str] = set()
    out = []
    for ex in sorted(executions, key=lambda e: e.start):
        if ex.end is None:
            kind = "interrupted"
        elif ex.failed:
            kind = "failed"
        else:
            kind = "again" if ex.job in seen else "done"
        seen.add(ex.job)
        out.append((ex, kind))
    return out


def _bars(tl: Timeline, scale: Scale, g: Geometry, lanes: Lanes) -> list[str]:
    slot_of, died = tl.slot_of(), deaths(tl)
    rows_end: dict[int, list[float]] = {}  # per slot, the end of the last bar in each sub-row
    placed: list[tuple[Execution, str, int, int, float]] = []
    for ex, kind in classify(tl.executions):
        slot = slot_of.get(ex.worker)
        if slot is None:
            lanes.unplaced += 1
            continue
        end = ex.end if ex.end is not None else died.get(ex.worker, ex.start)
        rows = rows_end.setdefault(slot, [])
        row = next((i for i, e in enumerate(rows) if e <= ex.start), None)
        if row is None:
            if len(rows) < MAX_SUBROWS:
                rows.append(end)
                row = len(rows) - 1
            else:
                row = min(range(len(rows)), key=rows.__getitem__)
        rows[row] = max(rows[row], end)
        placed.append((ex, kind, slot, row, end))
    out = []
    for ex, kind, slot, row, end in placed:
        n = len(rows_end[slot])
        h = g.lane_h / n
        y = g.y(slot) + row * h
        x0 = scale.x(ex.start)
        w = max(scale.x(end) - x0, 0.6 if kind == "done" else 2.0)  # the rare kinds must not vanish
        until = "killed" if ex.end is None else f"{end:.3f} s" + (f", acked {ex.acked:.3f} s" if ex.acked else "")
        tip = f"job {ex.job} · {ex.worker} · {ex.start:.3f} s → {until}{KIND_TEXT[kind]}"
        out.append(f'<rect class="x {kind}" x="{num(x0)}" y="{num(y + 0.5)}" width="{num(w)}" '
                   f'height="{num(max(h - 1, 1))}"><title>{esc(tip)}</title></rect>')  # fmt: skip
    return out


def _density(tl: Timeline, scale: Scale, g: Geometry, lanes: Lanes) -> list[str]:
    """Busy fraction per lane and time bucket, quantized to tenths so runs of equal buckets merge
    into one rect: a steady run costs a few rects per lane, not one per bucket."""
    buckets = max(20, int((scale.x1 - scale.x0) / 4))
    width = (scale.t1 - scale.t0) / buckets or 1.0
    slot_of, died = tl.slot_of(), deaths(tl)
    busy = [[0.0] * buckets for _ in range(g.slots)]
    t0 = scale.t0
    for ex in tl.executions:
        slot = slot_of.get(ex.worker)
        if slot is None or slot >= g.slots:
            lanes.unplaced += 1
            continue
        s = ex.start
        e = ex.end if ex.end is not None else died.get(ex.worker, s)
        lane = busy[slot]
        i, j = int((s - t0) / width), int((e - t0) / width)
        if i == j:
            if 0 <= i < buckets:
                lane[i] += e - s
            continue
        for b in range(max(i, 0), min(j, buckets - 1) + 1):
            lo, hi = max(s, t0 + b * width), min(e, t0 + (b + 1) * width)
            if hi > lo:
                lane[b] += hi - lo
    # A lane that runs several handlers at once is busy up to that many times over: scale to it.
    capacity = max(1, round(max((v for lane in busy for v in lane), default=0.0) / width))
    bw = (scale.x1 - scale.x0) / buckets
    out = []
    for slot, lane in enumerate(busy):
        y = num(g.y(slot))
        b = 0
        while b < buckets:
            level = min(10, math.ceil(lane[b] / (width * capacity) * 10))
            e = b + 1
            while e < buckets and min(10, math.ceil(lane[e] / (width * capacity) * 10)) == level:
                e += 1
            if level:
                out.append(f'<rect class="density" x="{num(scale.x0 + b * bw)}" y="{y}" width="{num((e - b) * bw)}"'
                           f' height="{num(g.lane_h)}" fill-opacity="{level / 10:g}"/>')  # fmt: skip
            b = e
    return out


def _marks(tl: Timeline, scale: Scale, g: Geometry) -> list[str]:
    """Every family's marks: a cross on the lane a fault hit, and what it shades after it."""
    out = []
    for m in (m for family in registry.FAMILIES for m in family.marks(tl)):
        if not 0 <= m.slot < g.slots:
            continue
        x, y = scale.x(m.at), g.y(m.slot)
        if m.span > 0:
            w = num(m.span * scale.px_per_s)
            out.append(
                f'<rect class="{esc(m.css)}-span" x="{num(x)}" y="{num(y)}" width="{w}" height="{num(g.lane_h)}"/>'
            )
        r = min(5.0, g.lane_h / 2 + 1)
        out.append(
            f'<g class="fault {esc(m.css)}" data-job="{esc(m.job)}"><title>{esc(m.tip)}</title>'
            f'<line x1="{num(x)}" x2="{num(x)}" y1="{num(y - 2)}" y2="{num(y + g.lane_h + 2)}"/>'
            f'<path d="M{num(x - r)} {num(y + g.lane_h / 2 - r)}l{num(2 * r)} {num(2 * r)}'
            f'm0 {num(-2 * r)}l{num(-2 * r)} {num(2 * r)}"/></g>'
        )
    return out


def _recovery(tl: Timeline, scale: Scale, g: Geometry, lanes: Lanes, arrow: str) -> tuple[list[str], list[str]]:
    """Fault -> next start of each job it hit, counted as crashbench.evidence.tally counts them: a later
    start by anyone is a recovery; no later start and no completion after the fault, never."""
    hit = {j for k in tl.signals for j in k.jobs}
    runs_of: dict[str, list[Execution]] = {j: [] for j in hit}
    for ex in tl.executions:
        if ex.job in runs_of:
            runs_of[ex.job].append(ex)
    slot_of = tl.slot_of()
    lines, marks = [], []
    for k in tl.signals:
        if k.job is None or not 0 <= k.slot < g.slots:
            continue
        for n, job in enumerate(k.jobs):
            recovered, markup = _one_recovery(k, job, n, runs_of[job], slot_of, scale, g, lanes, arrow)
            if markup:
                (lines if recovered else marks).append(markup)
    return lines, marks


def _one_recovery(
    k: SignalRecord, job: str, n: int, runs: list[Execution], slot_of: dict[str, int], scale: Scale, g: Geometry,
    lanes: Lanes, arrow: str,
) -> tuple[bool, str]:  # fmt: skip
    """(whether the job started again, its line or its never-recovered mark)."""
    later = [ex for ex in runs if ex.start > k.at]
    x1, y1 = scale.x(k.at), g.mid(k.slot)
    if later:
        nxt = min(later, key=lambda e: e.start)
        ms = round((nxt.start - k.at) * 1000, 3)
        lanes.recoveries.append(ms)
        slot = min(slot_of.get(nxt.worker, k.slot), g.slots - 1)
        x2, y2 = scale.x(nxt.start), g.mid(slot)
        # Arc over the lanes, higher for a longer wait, so lines from faults close together part.
        lift = min(g.gap + g.lane_h * 0.9, 10 + (x2 - x1) * 0.08)
        ytop = min(y1, y2) - lift
        tip = f"job {job}: hit at {k.at:.3f} s, started again {ms:.0f} ms later by {nxt.worker}"
        label = f"{ms:.0f} ms" if (x2 - x1) > 44 else ""
        mx, my = (x1 + x2) / 2, ytop + (min(y1, y2) - ytop) * 0.25
        return True, (
            f'<g class="recovery" data-job="{esc(job)}" data-ms="{ms!r}"><title>{esc(tip)}</title>'
            f'<path d="M{num(x1)} {num(y1)}C{num(x1)} {num(ytop)} {num(x2)} {num(ytop)} {num(x2)} {num(y2 - 3)}" '
            f'marker-end="url(#{arrow})"/>'
            + (f'<text x="{num(mx)}" y="{num(my - 2)}" text-anchor="middle">{label}</text>' if label else "")
            + "</g>"
        )
    if any(ex.completed and ex.end is not None and ex.end > k.at for ex in runs):
        return False, ""  # a pause or a graceful stop: the job finished in the execution it was in
    lanes.unrecovered.append(job)
    y = g.y(k.slot) - g.gap / 2 - 1 - n * 2
    tip = f"job {job}: hit at {k.at:.3f} s, never started again"
    # Left of the mark: right of it is where the replacement worker's name goes.
    text = f'<text x="{num(x1 - 8)}" y="{num(y + 3.5)}" text-anchor="end">never ran again</text>' if g.gap >= 12 else ""
    return False, (
        f'<g class="unrecovered" data-job="{esc(job)}"><title>{esc(tip)}</title>'
        f'<circle cx="{num(x1)}" cy="{num(y)}" r="5"/><path d="M{num(x1 - 2.5)} {num(y - 2.5)}l5 5m0 -5l-5 5"/>'
        f"{text}</g>"
    )


LABEL_CHAR_W = 6.5  # px per character of a band label (the page's 11 px sans-serif, generously)


def _bands(tl: Timeline, scale: Scale, g: Geometry) -> list[str]:
    """Every family's bands, each labelled above the lanes; then the run's events as lines across them."""
    out = []
    y0, y1 = g.top, g.bottom
    label_end = -math.inf  # where the last band label drawn ends: one that would overlap it is left out
    for b in sorted((b for family in registry.FAMILIES for b in family.bands(tl)), key=lambda b: b.at):
        x0 = scale.x(b.at)
        w = num(max(scale.x(b.until if b.until is not None else scale.t1) - x0, 2))
        if b.slots is None:
            rects = [f'<rect x="{num(x0)}" y="{num(y0)}" width="{w}" height="{num(y1 - y0)}"/>']
        else:
            rects = [f'<rect x="{num(x0)}" y="{num(g.y(s))}" width="{w}" height="{num(g.lane_h)}"/>'
                     for s in b.slots if 0 <= s < g.slots]  # fmt: skip
        out.append(f'<g class="band {esc(b.css)}"><title>{esc(b.tip)}</title>{"".join(rects)}</g>')
        if x0 + 3 >= label_end:  # a rollout's stops a few ms apart: one "deploy" label, each band its tooltip
            out.append(
                f'<text class="band-label {esc(b.css)}" x="{num(x0 + 3)}" y="{num(y0 - 3)}">{esc(b.label)}</text>'
            )
            label_end = x0 + 3 + LABEL_CHAR_W * len(b.label) + 4
    # Events closer than EVENT_GAP share one label, at the first of them: there is one line of room above.
    groups: list[list[tuple[float, str, float]]] = []
    for m in tl.marks:
        if m.what in EVENTS:
            x = scale.x(m.t)
            if groups and x - groups[-1][0][0] < EVENT_GAP:
                groups[-1].append((x, m.what, m.t))
            else:
                groups.append([(x, m.what, m.t)])
    for group in groups:
        for x, what, t in group:
            out.append(f'<g class="event {what}"><title>{EVENTS[what]} at {t:.3f} s</title>'
                       f'<line x1="{num(x)}" x2="{num(x)}" y1="{num(y0 - 8)}" y2="{num(y1)}"/></g>')  # fmt: skip
        label = " · ".join(EVENTS[what] for _, what, _ in group)
        out.append(f'<text class="event-label" x="{num(group[0][0])}" y="{num(y0 - 10)}" '
                   f'text-anchor="middle">{label}</text>')  # fmt: skip
    return out


def _workers(tl: Timeline, scale: Scale, g: Geometry) -> list[str]:
    """The worker in each slot from its spawn on, named in the gutter above its lane."""
    out = []
    for slot in range(g.slots):
        out.append(f'<text class="lane-label" x="{num(scale.x0 - 8)}" y="{num(g.mid(slot) + 4)}" '
                   f'text-anchor="end">slot {slot}</text>')  # fmt: skip
        out.append(f'<rect class="lane" data-slot="{slot}" x="{num(scale.x0)}" y="{num(g.y(slot))}" '
                   f'width="{num(scale.x1 - scale.x0)}" height="{num(g.lane_h)}"/>')  # fmt: skip
    if g.gap >= 12:
        for s in tl.spawns:
            if s.slot < g.slots:
                # Clear of the kill mark that, but for the first, stands just before each spawn.
                x = num(scale.x(s.t) + (7 if s.t > 0.05 else 0))
                out.append(f'<text class="worker" x="{x}" y="{num(g.y(s.slot) - 3)}">{esc(s.worker)}</text>')
    return out


def _passes(tl: Timeline, scale: Scale, y: float) -> list[str]:
    """Recovery passes as ticks under the lanes; a pass that gave jobs back stands taller."""
    out = []
    for m in tl.marks:
        if m.what != "recover":
            continue
        gave = f"gave back {m.n}" if m.n >= 0 else "gave back an untold number"
        tall = 7 if m.n > 0 else 4
        x = num(scale.x(m.t))
        out.append(f'<line class="pass{" gave" if m.n > 0 else ""}" x1="{x}" x2="{x}" y1="{num(y)}" '
                   f'y2="{num(y + tall)}"><title>recovery pass at {m.t:.3f} s: {gave}</title></line>')  # fmt: skip
    return out


def draw(tl: Timeline, scale: Scale, top: float, arrow: str = "arrow") -> Lanes:
    """The lane chart of one run, from y = `top` (markup for inside an <svg>, no <svg> of its own);
    `arrow`: the id of the arrowhead marker the enclosing <svg> defines."""
    g = geometry(slot_count(tl), top + 16)
    aggregated = len(tl.executions) > AGGREGATE_ABOVE
    lanes = Lanes("", 0.0, aggregated)
    parts = _workers(tl, scale, g)
    parts += _bands(tl, scale, g)
    parts += _density(tl, scale, g, lanes) if aggregated else _bars(tl, scale, g, lanes)
    parts += _marks(tl, scale, g)
    lines, marks = _recovery(tl, scale, g, lanes, arrow)
    parts += lines + marks
    if any(m.what == "recover" for m in tl.marks):
        parts.append(f'<text class="pass-label" x="{num(scale.x0 - 8)}" y="{num(g.bottom + 12)}" '
                     f'text-anchor="end">recovery passes</text>')  # fmt: skip
        parts += _passes(tl, scale, g.bottom + 4)
    lanes.svg = "".join(parts)
    lanes.height = g.bottom + 16 - top
    return lanes
