"""Rich rendering of results and progress. CLI-side only: the core never imports this."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from crashbench.model.bench import BenchResult
from crashbench.model.counts import Problem
from crashbench.model.faults import BrokerFaultRecord, NetworkFaultRecord, broker_fault_text
from crashbench.model.results import DesignRun, Result, ThresholdResult, group, number, spread
from crashbench.model.results import label as label_of
from crashbench.model.thresholds import coverage
from crashbench.report import rows as table_rows
from crashbench.report.rows import ALARM, ROWS, effect_note, threshold_detail
from crashbench.run.progress import Progress

IDS_SHOWN = 10  # per problem in the table; stderr and the JUnit report list them all
EXITS_SHOWN = 5  # workers that ended on their own, named one line each; the rest counted by how they ended


def _recovery(ms: float) -> str:
    return "never" if math.isinf(ms) else f"{ms:.0f} ms"  # a hit job that never ran again


def _failed_metrics(result: Result, name: str) -> set[str]:
    return {t.threshold.split(" ")[0].split(".")[0] for t in result.thresholds if t.design == name and not t.met}


def _resumed(nf: NetworkFaultRecord) -> str:
    """The slowest of the faulted slots first (the queue is back once all are), then each slot's."""
    if not nf.slot_resume_ms:  # the producer; or a result saved before per-slot times (the first slot's)
        if nf.resume_ms is None:
            return "never resumed"
        return f"resumed {nf.resume_ms / 1000:.2f} s after" if nf.target == "producer" else (
            f"first slot resumed {nf.resume_ms / 1000:.2f} s after"
        )  # fmt: skip
    each = ", ".join(
        f"slot {s} {'never' if ms is None else f'{ms / 1000:.2f} s'}"
        for s, ms in zip(nf.slots, nf.slot_resume_ms, strict=True)
    )
    if nf.slowest_resume_ms is None:
        return f"not all resumed ({each})"
    head = "resumed" if len(nf.slots) == 1 else "all resumed"
    return f"{head} {nf.slowest_resume_ms / 1000:.2f} s after" + (f" ({each})" if len(nf.slots) > 1 else "")


def promotion_resumed(bf: BrokerFaultRecord) -> str:
    """After a promotion behind Sentinel: how soon each worker slot ran a job again, the slowest first."""
    if not bf.slot_resume_ms:
        return ""
    times = [ms for ms in bf.slot_resume_ms if ms is not None]
    each = ", ".join(
        f"slot {s} {'never' if ms is None else f'{ms / 1000:.2f} s'}" for s, ms in enumerate(bf.slot_resume_ms)
    )
    if len(times) < len(bf.slot_resume_ms):
        return f"; not every worker ran a job after the promotion ({each})"
    return f"; every worker ran a job {max(times) / 1000:.2f} s after the promotion at the latest ({each})"


def network_line(nf: NetworkFaultRecord) -> str:
    """One network fault and how the queue came back from it."""
    where = {"producer": "the producer", "replica": "the replica link"}.get(
        nf.target, "slot(s) " + ", ".join(map(str, nf.slots))
    )
    healed = f"to {nf.healed_at:.2f} s" if nf.healed_at is not None else "to the end"
    text = f"network {nf.toxic} on {where} from {nf.at:.2f} s {healed}"
    if nf.healed_at is None:
        return text
    resumed = _resumed(nf)
    if nf.target == "replica":
        resumed = "healed"  # the replica's catching up is not the queue's progress
    drained = f", drained {nf.drained_ms / 1000:.2f} s after" if nf.drained_ms is not None else ""
    stuck = f"; STUCK: slot(s) {', '.join(map(str, nf.stuck))}" if nf.stuck else ""
    rates = " / ".join(f"{r:g}" for r in nf.per_s)
    return f"{text}: {resumed}{drained}; completions/s before / during / after {rates}{stuck}"


def threshold_line(t: ThresholdResult) -> Text:
    detail = threshold_detail(t)
    if t.source == "default":
        detail += "; default"  # nobody wrote it: say where it came from
    mark, style = {"pass": ("✓", "green"), "fail": ("✗", "red"), "inconclusive": ("?", "yellow")}[t.status]
    return Text(f"{mark} {t.design}: {t.threshold} ({detail})", style=style)


def result_table(result: Result, plain: bool = False) -> Group:
    """The counts per design (median and range over repeats), then notes and threshold lines. `plain`:
    an ASCII table for CI logs."""
    sc = result.scenario
    groups = group(result.runs)
    design = f"{result.runs[0].design}: " if result.kind == "sweep" and result.runs else ""
    repeats = f", {result.repeat} repeats (median, min-max)" if result.repeat > 1 else ""
    title = design + (
        f"{sc['name']}: {sc['jobs']} jobs x {sc['job_ms']:g} ms, {sc['workers']} workers, "
        f"{table_rows.kills_phrase(sc, 'x')}, seed {sc['seed']}{repeats}"
    )
    # The title above the table, not in it: a table title wraps at the table's width, which depends
    # on the figures, so where it broke ("2 / repeats") changed from one result to the next.
    table = Table(box=box.ASCII if plain else box.HEAVY_HEAD)
    table.add_column("", style="bold")
    for name in groups:
        table.add_column(Text(name), justify="right")  # a design's name is data, never markup
    failed = {name: _failed_metrics(result, name) for name in groups}
    for label, key in ROWS:
        if not table_rows.shown(key, result.runs):
            continue
        cells = []
        for name, runs in groups.items():
            values = [getattr(r.counts, key) for r in runs]
            bad = key in failed[name]
            style = "red" if bad else ("yellow" if any(values) and key in ALARM else "")
            cells.append(Text(f"{spread(values)}{' ✗' if bad else ''}", style=style))
        table.add_row(label, *cells)
    table.add_section()
    rows: list[tuple[str, Callable[[DesignRun], float | None], Callable[[float], str]]] = [
        ("kills", lambda r: r.counts.kills, number),
        ("  mid-job", lambda r: r.counts.kills_mid_job, number),
        ("wall time", lambda r: r.timings.wall_s, lambda v: f"{v:.2f} s"),
        ("  x ideal", lambda r: r.timings.ratio_to_ideal, lambda v: f"{v:.2f}x"),
        ("jobs/s", lambda r: r.timings.jobs_per_s, lambda v: f"{v:.0f}"),
        ("worker start (median)", lambda r: r.timings.startup_ms_median, lambda v: f"{v:.1f} ms"),
        ("restart (median)", lambda r: r.timings.restart_ms_median, lambda v: f"{v:.1f} ms"),
        ("recovery p50", lambda r: r.timings.recovery_ms_p50, _recovery),
        ("recovery p95", lambda r: r.timings.recovery_ms_p95, _recovery),
        ("recovery max", lambda r: r.timings.recovery_ms_max, _recovery),
        ("delay lateness p50", lambda r: r.timings.delay_lateness_ms_p50, lambda v: f"{v:.0f} ms"),
        ("delay lateness p95", lambda r: r.timings.delay_lateness_ms_p95, lambda v: f"{v:.0f} ms"),
        ("delay lateness max", lambda r: r.timings.delay_lateness_ms_max, lambda v: f"{v:.0f} ms"),
    ]
    for label, get, fmt in rows:
        if label.startswith(("recovery", "delay")) and all(get(r) is None for r in result.runs):
            continue
        table.add_row(label, *[spread([get(r) for r in runs], fmt) for runs in groups.values()])
    parts: list[Table | Text] = [Text(title, style="table.title"), table]
    for run in result.runs:
        name = label_of(run) + (f" [seed {run.seed}]" if result.repeat > 1 else "")
        if (bf := run.broker_fault) is not None:
            back = f", back at {bf.back_at:.2f} s" if bf.back_at is not None else ""
            parts.append(
                Text(
                    f"{name}: {broker_fault_text(bf.kind)} at {bf.at:.2f} s{back} ({bf.persistence} persistence); "
                    "Redis held "
                    f"{bf.held_at_fault} jobs at the fault (done later or not: the table counts those never "
                    f"done), {bf.acknowledged_before} enqueues acknowledged before{promotion_resumed(bf)}",
                    style="yellow",
                )
            )
        for nf in run.network_faults:
            parts.append(Text(f"{name}: {network_line(nf)}", style="red" if nf.stuck else "yellow"))
        if run.configuration:
            shown = ", ".join(f"{k} {number(v) if isinstance(v, float) else v}" for k, v in run.configuration.items())
            parts.append(Text(f"{name}: library settings: {shown}", style="dim"))
        for text in run.warnings:
            parts.append(Text(f"! {text}", style="yellow"))
        if run.timings.cut_off:
            parts.append(
                Text(
                    f"{name}: {run.counts.undrained} jobs undrained: the drain stopped at its bound "
                    f"({10 * run.timings.window_s:g} s after the last fault) while the queue was still running"
                    " jobs (--drain-timeout raises it)",
                    style="yellow",
                )
            )
        elif not run.timings.drained:
            parts.append(
                Text(
                    f"{name}: the queue made no progress for {run.timings.window_s:g} s (the window) with jobs still"
                    f" in it: {run.counts.stranded} stranded, {run.counts.undrained} undrained (--drain-timeout waits"
                    " longer)",
                    style="yellow",
                )
            )
        if ids := run.jobs.get("library_disagrees"):
            shown = ", ".join(ids[:IDS_SHOWN]) + (" ..." if len(ids) > IDS_SHOWN else "")
            parts.append(
                Text(
                    f"{name}: {run.counts.library_disagrees} jobs the library recorded otherwise than the ledger "
                    f"(failed although completed, or done although never completed): {shown}",
                    style="yellow",
                )
            )
        if note := effect_note(run, IDS_SHOWN):
            parts.append(Text(f"{name}: {note}", style="yellow"))
        for where, n in run.counts.stranded_at.items():
            parts.append(Text(f"{name}: {n} stranded in {where}", style="yellow"))
        if run.consumers:
            shown = ", ".join(f"{c.name} ({c.pending} pending, idle {c.idle_ms / 1000:.1f} s)" for c in run.consumers)
            parts.append(Text(f"{name}: consumers left in the group: {shown}", style="dim"))
        for w in run.worker_exits[:EXITS_SHOWN]:
            parts.append(Text(f"! {name}: worker {w.worker} ended on its own ({w.how})", style="yellow"))
        if len(run.worker_exits) > EXITS_SHOWN:  # a library whose workers exit while the server is down: dozens
            more = run.worker_exits[EXITS_SHOWN:]
            hows = Counter(w.how for w in more)
            why = ", ".join(f"{n} {how}" for how, n in hows.most_common())
            parts.append(Text(f"! {name}: {len(more)} more workers ended on their own ({why}; all in the JSON)",
                              style="yellow"))  # fmt: skip
        if run.workdir:
            # A path to copy: never wrapped or cut (the caller prints with crop=False).
            line = f"{name}: ledgers and worker logs kept in {run.workdir}"
            parts.append(Text(line, style="dim", no_wrap=True, overflow="ignore"))
    parts.extend(threshold_line(t) for t in result.thresholds)
    parts.extend(coverage_line(name, text) for name, text in coverage(result).items())
    parts.extend(problem_lines(result))
    return Group(*parts)


def coverage_line(name: str, text: str) -> Text:
    """How much each design was checked, not only how it came out: "reliable: 6 thresholds, all met"."""
    style = "green" if text.endswith("all met") else "red" if "violated" in text else "yellow"
    return Text(f"{name}: {text}", style=style)


def problem_text(p: Problem) -> str:
    ids = ", ".join(p.ids[:IDS_SHOWN]) + (", …" if len(p.ids) > IDS_SHOWN else "")
    return f"[{p.check}] {p.message}" + (f" (ids: {ids})" if ids else "")


def problem_lines(result: Result) -> list[Text]:
    """The evidence checks that failed, in red: every figure above is then in doubt."""
    if not result.problems:
        return []
    lines = [Text("evidence problems (crashbench or the design's report is wrong):", style="bold red")]
    for run in result.runs:
        name = label_of(run) + (f" [seed {run.seed}]" if result.repeat > 1 else "")
        lines += [Text(f"! {name}: {problem_text(p)}", style="red") for p in run.problems]
    return lines


def progress_line(p: Progress) -> Text:
    return Text.assemble(
        (f"{p.design:>10} ", "bold"),
        (f"{p.phase:<9} ", "cyan"),
        f"done {p.done}/{p.enqueued}  kills {p.kills}/{p.kills_total}  workers alive {p.alive}  {p.elapsed:5.1f} s",
    )


def bench_tables(result: BenchResult, plain: bool = False) -> Group:
    st = result.settings
    style = box.ASCII if plain else box.HEAVY_HEAD
    title = (
        f"bench: {st.jobs} jobs of {st.job_ms:g} ms, no faults, {st.repeat} repeats (median, min-max); "
        f"latency at half the throughput, {st.latency_jobs} jobs; {result.wall_s:.1f} s in all"
    )
    table = Table(title=title, title_justify="left", box=style)
    for name in ("design", "workers", "jobs/s", "min-max", "bare loop", "harness/bare", "enqueue/s", "cmds/job"):
        table.add_column(name, justify="left" if name == "design" else "right")
    for p in result.points:
        table.add_row(
            p.design, str(p.workers), f"{p.jobs_per_s.median:,.0f}", f"{p.jobs_per_s.min:,.0f}-{p.jobs_per_s.max:,.0f}",
            f"{p.bare_jobs_per_s.median:,.0f}", f"{p.overhead_ratio:.2f}x", f"{p.enqueue_per_s.median:,.0f}",
            f"{p.commands_per_job:.2f}",
        )  # fmt: skip
    cost = Table(title="latency (enqueue -> done, ms) and cost", title_justify="left", box=style)
    for name in ("design", "workers", "p50", "p99", "high p50", "low p50", "server cpu", "workers cpu", "server peak"):
        cost.add_column(name, justify="left" if name == "design" else "right")
    for p in result.points:
        cost.add_row(
            p.design, str(p.workers), _opt(p.latency_p50_ms), _opt(p.latency_p99_ms), _opt(p.latency_high_p50_ms),
            _opt(p.latency_low_p50_ms), "-" if p.server_cpu is None else f"{p.server_cpu:.2f}",
            f"{p.client_cpu:.2f}", "-" if p.server_peak_rss_mb is None else f"{p.server_peak_rss_mb:.1f} MB",
        )  # fmt: skip
    restarts = Table(title="worker restart: SIGKILL -> replacement READY", title_justify="left", box=style)
    restarts.add_column("design")
    restarts.add_column("median", justify="right")
    restarts.add_column("samples (ms)", justify="right")
    for r in result.restarts:
        restarts.add_row(r.design, f"{r.median_ms:.1f} ms", ", ".join(f"{v:.1f}" for v in r.samples_ms))
    parts: list[Table | Text] = [table, cost, restarts]
    if result.memory:
        memory = Table(title="memory of queued jobs (MEMORY USAGE)", title_justify="left", box=style)
        for name in ("backlog", "measured on", "bytes per job", "per 1M jobs"):
            memory.add_column(name, justify="left" if name == "backlog" else "right")
        for m in result.memory:
            memory.add_row(m.structure, f"{m.jobs:,} jobs", f"{m.bytes_per_job:.1f}", f"{m.mb_per_million:.0f} MB")
        parts.append(memory)
    if result.proxy:
        parts.append(proxy_table(result, style))
    return Group(*parts)


def proxy_table(result: BenchResult, style: box.Box) -> Table:
    """bench --proxy: jobs/s with the workers connected directly and through the network fault proxy."""
    title = f"network fault proxy, no toxic on: jobs/s, median of {result.settings.repeat} (min-max in the JSON)"
    table = Table(title=title, title_justify="left", box=style)
    for name in ("design", "workers", "job ms", "jobs", "direct", "through proxy", "through/direct"):
        table.add_column(name, justify="left" if name == "design" else "right")
    for c in result.proxy:
        table.add_row(
            c.design, str(c.workers), f"{c.job_ms:g}", f"{c.jobs:,}", f"{c.direct.median:,.0f}",
            f"{c.through.median:,.0f}", f"{c.ratio:.2f}x",
        )  # fmt: skip
    return table


def _opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
