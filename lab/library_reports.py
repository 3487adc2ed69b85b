"""The user reports' table (docs/findings/library-reports.md): each report of a queue library's bug tracker
(issue 29), the scenario that reproduces it, the counts that matter for its claim per library, whether
the claim holds here (a rule per report, from the counts), and the setting that fixes it, measured where
crashbench can run it. One result file per run, OUT/<report>/<run>.json, written by the installed
`crashbench` command; then the table from them.

    python lab/library_reports.py run results/readme/library-reports [--worker-python PATH] [--only ID,...]
    python lab/library_reports.py table results/readme/library-reports [--doc docs/findings/library-reports.md]

`table --doc FILE` writes the table into FILE between its two markers (MARK_BEGIN, MARK_END) instead of
printing it. A run whose `crashbench` exits other than 0 or 1 (1: a scenario's expectation failed, the
result is written all the same) leaves OUT/<report>/<run>.txt with its last line, shown in the table.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crashbench.model.results import DesignRun, Result

Measured = dict[str, dict[str, DesignRun]]  # run key -> design -> its run
MARK_BEGIN = "<!-- library-reports table: python lab/library_reports.py table results/readme/library-reports -->"
MARK_END = "<!-- end of the library-reports table -->"


@dataclass(frozen=True)
class Run:
    key: str  # its result file: OUT/<report>/<key>.json
    scenario: str
    designs: str
    args: tuple[str, ...] = ()
    worker_python: bool = False  # arq and saq: under --worker-python

    def command(self) -> list[str]:
        return ["crashbench", "compare", "-s", self.scenario, "--designs", self.designs, *self.args, "--plain"]


@dataclass(frozen=True)
class Report:
    id: str
    links: str
    claim: str
    runs: tuple[Run, ...]
    show: tuple[str, ...]  # counts (crashbench.model.counts.Counts) or timings (..._ms_...) shown
    rule: str  # the rule, as text
    holds: Callable[[Measured], bool] | None
    fix: str
    fixed: tuple[tuple[str, str], ...] = ()  # (run key, design): the fix's configuration, in the fix column
    skip: str = ""  # why the report is not reproduced here


def count(m: Measured, key: str, design: str, name: str) -> float:
    run = m[key][design]
    value = getattr(run.counts, name) if hasattr(run.counts, name) else getattr(run.timings, name)
    return math.inf if value is None else value


def _any(m: Measured, key: str, test: Callable[[DesignRun], bool], designs: tuple[str, ...] = ()) -> bool:
    return any(test(r) for d, r in m[key].items() if not designs or d in designs)


def _arq_402(m: Measured) -> bool:
    """arq retries a lost job only once its in-progress key expires: job_timeout + 10 s after its start."""
    arq, reliable = m["claim"]["arq"], m["claim"]["arq:reliable"]
    never = count(m, "claim", "arq", "recovery_ms_p50") == math.inf and arq.counts.kills_mid_job > 0
    bound = float(reliable.configuration.get("job_timeout_s", 0)) * 1000
    return never and arq.timings.window_s < 310 and count(m, "claim", "arq:reliable", "recovery_ms_p50") >= bound


def _celery_3501(m: Measured) -> bool:
    return any(count(m, k, "celery", "lost") + count(m, k, "celery", "stranded") > 0 for k in ("claim", "restart"))


def _late_or_missing(r: DesignRun) -> bool:
    return (r.timings.delay_lateness_ms_max or 0) > 60_000 or r.counts.lost + r.counts.stranded > 0


REPORTS: tuple[Report, ...] = (
    Report(
        "celery-1628", "celery/celery#1628",
        "a task OOM-kills its pool child; with late acks the message is acked anyway, and lost",
        (Run("claim", "oom-acks-late", "celery:acks-late,celery"),
         Run("fix", "crash-loop-libraries", "celery:acks-late", ("--crash-how", "memory"))),
        ("crash_jobs", "crash_attempts", "lost", "failed", "stranded", "crash_looping"),
        "`celery:acks-late` with reject_on_worker_lost off: lost + failed > 0, nothing stranded",
        lambda m: (c := m["claim"]["celery:acks-late"].counts).lost + c.failed > 0 and c.stranded == 0,
        "`task_reject_on_worker_lost = True` (with acks_late): requeued instead of acked, but on every death: a loop",
        (("fix", "celery:acks-late"),),
    ),
    Report(
        "kombu-337", "celery/kombu#337, celery/celery#2481, #7009",
        "an ETA/countdown longer than the visibility timeout is delivered again every timeout, runs N times",
        (Run("claim", "delayed-long", "celery:acks-late,celery"),),
        ("done", "duplicated", "duplicated_overlapping", "extra_executions", "early_starts"),
        "`celery:acks-late` (visibility 2 s, countdown 5 s): duplicated > 0",
        lambda m: m["claim"]["celery:acks-late"].counts.duplicated > 0,
        "`visibility_timeout` above the longest countdown/ETA (Celery as installed: 1 h)",
        (("claim", "celery"),),
    ),
    Report(
        "celery-3501", "celery/celery#3501, #1307",
        "countdown tasks lost on `kill -9` of the worker, or after a Redis restart",
        (Run("claim", "delayed-kill", "celery,celery:acks-late"),
         Run("restart", "delayed-broker-kill", "celery,celery:acks-late"),
         Run("fix", "delayed-broker-kill", "celery", ("--persistence", "aof-everysec", "--drain-timeout", "20"))),
        ("done", "lost", "stranded", "duplicated", "held_at_fault"),
        "`celery` never completes a countdown task (lost + stranded > 0) after the kill or the restart",
        _celery_3501,
        "none found: a shorter `visibility_timeout` restores them sooner but runs long countdowns N times "
        "(kombu#337); persistence (`appendonly yes`) keeps them through a restart, in `unacked` for that timeout",
        (("fix", "celery"),),
    ),
    Report(
        "celery-4976", "celery/celery#4976",
        "with the gevent pool, unacked messages are never restored",
        (Run("claim", "default", "celery:gevent", ("--jobs", "120", "--job-ms", "300", "--kills", "3",
                                                   "--concurrency", "2", "--drain-timeout", "30")),),
        ("kills_mid_job", "done", "lost", "stranded", "redelivered", "duplicated"),
        "a killed worker's unacked tasks never come back: stranded > 0",
        lambda m: _any(m, "claim", lambda r: r.counts.stranded > 0),
        "-",
    ),
    Report(
        "celery-7950", "celery/celery#7950, celery/kombu#305",
        "tasks lost around a warm shutdown (SIGTERM)",
        (Run("claim", "warm-shutdown", "celery,celery:acks-late"),),
        ("kills_mid_job", "done", "lost", "stranded", "duplicated", "interrupted"),
        "either configuration: lost > 0",
        lambda m: _any(m, "claim", lambda r: r.counts.lost > 0),
        "-",
    ),
    Report(
        "rq-1846", "rq/rq#1846",
        "the job in progress when Redis restarts is never finished nor retried",
        (Run("claim", "broker-kill-aof-everysec", "rq",
             ("--jobs", "200", "--downtime", "0.1", "--drain-timeout", "30")),),
        ("held_at_fault", "done", "lost", "stranded", "duplicated", "worker_crashes"),
        "`rq`: lost + stranded > 0",
        lambda m: count(m, "claim", "rq", "lost") + count(m, "claim", "rq", "stranded") > 0,
        "-",
    ),
    Report(
        "rq-2015", "rq/rq#2015",
        "jobs lost when killing workers",
        (Run("claim", "default", "rq,rq:reliable", ("--jobs", "400", "--drain-timeout", "70")),),
        ("kills_mid_job", "done", "lost", "stranded", "duplicated", "recovery_ms_p50"),
        "`rq`: lost + stranded > 0 (never completed)",
        lambda m: count(m, "claim", "rq", "lost") + count(m, "claim", "rq", "stranded") > 0,
        "`Retry` and a `job_timeout` sized to the job (`rq:reliable`): StartedJobRegistry's cleanup retries it",
        (("claim", "rq:reliable"),),
    ),
    Report(
        "dramatiq-527", "Bogdanp/dramatiq#527",
        "delayed messages run hours late after Redis restarts",
        (Run("claim", "delayed-broker-kill", "dramatiq,dramatiq:reliable",
             ("--persistence", "aof-everysec", "--drain-timeout", "30")),),
        ("done", "lost", "stranded", "delay_lateness_ms_p95", "delay_lateness_ms_max"),
        "either configuration: lateness max > 60 s, or lost/stranded > 0",
        lambda m: _any(m, "claim", _late_or_missing),
        "-",
    ),
    Report(
        "dramatiq-692", "Bogdanp/dramatiq#692",
        "a CPU-bound job holding the GIL starves the heartbeat; the message is requeued while it runs",
        (Run("claim", "gil-heartbeat", "dramatiq:reliable,dramatiq"),),
        ("done", "duplicated", "duplicated_overlapping", "lost"),
        "`dramatiq:reliable` (heartbeat_timeout 1 s, 3 s jobs): duplicated_overlapping > 0",
        lambda m: m["claim"]["dramatiq:reliable"].counts.duplicated_overlapping > 0,
        "`heartbeat_timeout` above the longest job (as installed: 60 s)",
        (("claim", "dramatiq"),),
    ),
    Report(
        "arq-402", "python-arq/arq#402",
        "a lost job is retried only after the (longest) function's timeout",
        (Run("claim", "default", "arq,arq:reliable", ("--jobs", "300", "--drain-timeout", "30"), worker_python=True),),
        ("kills_mid_job", "done", "stranded", "duplicated", "recovery_ms_p50", "recovery_ms_max"),
        "`arq` (job_timeout 300 s): no retry in a 30 s window; `arq:reliable`: recovery p50 >= its job_timeout",
        _arq_402,
        "`job_timeout` sized to the job (`arq:reliable`): retried job_timeout + 10 s later",
        (("claim", "arq:reliable"),),
    ),
    Report(
        "rq-1280", "rq/rq#1280 (Sidekiq, BullMQ alike)",
        "`maxmemory` eviction silently drops queued jobs",
        (Run("claim", "eviction-allkeys-lru", "rq,celery:acks-late,huey", ("--drain-timeout", "20")),
         Run("fix", "eviction-noeviction", "celery:acks-late,huey", ("--drain-timeout", "20")),
         Run("fix-rq", "eviction-noeviction", "rq", ("--drain-timeout", "20"))),
        ("lost", "lost_to_eviction", "evicted_keys", "indeterminate", "oom_refused"),
        "any library under allkeys-lru: lost_to_eviction > 0",
        lambda m: _any(m, "claim", lambda r: r.counts.lost_to_eviction > 0),
        "`maxmemory-policy noeviction` (or volatile-* with no TTL on queue keys): enqueues refused, none dropped",
        (("fix-rq", "rq"), ("fix", "celery:acks-late"), ("fix", "huey")),
    ),
    Report(
        "k8s-rollout", "Kubernetes rollouts",
        "SIGTERM, a grace, then SIGKILL lose a few in-flight jobs per rollout",
        (Run("claim", "deploy-long-jobs", "rq,celery,dramatiq,huey", ("--drain-timeout", "15")),
         Run("fix", "deploy-long-jobs", "celery:acks-late,dramatiq:reliable", ("--drain-timeout", "15"))),
        ("deploy_interrupted", "deploy_lost", "lost", "stranded", "duplicated"),
        "as installed, some library: deploy_lost > 0",
        lambda m: _any(m, "claim", lambda r: r.counts.deploy_lost > 0),
        "a grace above the longest job; late acks (`celery:acks-late`, `dramatiq:reliable`) give the killed job back",
        (("fix", "celery:acks-late"), ("fix", "dramatiq:reliable")),
    ),
    Report(
        "crash-loop", "reject-on-worker-lost loops",
        "a job that kills its worker on every attempt is requeued for ever",
        (Run("claim", "crash-loop-libraries", "celery:acks-late,dramatiq:reliable"),),
        ("crash_jobs", "crash_attempts", "crash_looping", "stranded", "dead_lettered"),
        "some library: crash_looping > 0",
        lambda m: _any(m, "claim", lambda r: r.counts.crash_looping > 0),
        "none in Celery or Dramatiq: no bound on redeliveries after a worker's death (a delivery counter in the task)",
    ),
    Report(
        "huey-796", "coleifer/huey#796",
        "huey treats SIGTERM as a hard stop: the running task is lost",
        (Run("claim", "default", "huey,huey:requeue",
             ("--signal", "SIGTERM", "--jobs", "300", "--job-ms", "200", "--kills", "3", "--drain-timeout", "10")),),
        ("kills_mid_job", "done", "lost", "duplicated"),
        "`huey`: lost > 0",
        lambda m: m["claim"]["huey"].counts.lost > 0,
        "huey's recipe: requeue on `SIGNAL_INTERRUPTED` (`huey:requeue`)",
        (("claim", "huey:requeue"),),
    ),
)  # fmt: skip


def run(out: Path, worker_python: str | None, only: list[str]) -> None:
    for report in REPORTS:
        if only and report.id not in only:
            continue
        for r in report.runs:
            directory = out / report.id
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{r.key}.txt").unlink(missing_ok=True)  # an earlier run's failure
            if r.worker_python and not worker_python:
                (directory / f"{r.key}.txt").write_text("not run: needs --worker-python\n")
                continue
            cmd = r.command() + (["--worker-python", worker_python] if r.worker_python and worker_python else [])
            cmd += ["--out", str(directory / f"{r.key}.json")]
            print(f"{report.id} {r.key}: {' '.join(cmd[1:])}", flush=True)
            done = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
            sys.stderr.write(done.stderr)
            if done.returncode not in (0, 1):  # 1: an expectation failed; the result is written all the same
                lines = done.stderr.strip().splitlines() or [""]
                error = next((line for line in lines if line.startswith("crashbench: error:")), "")
                last = lines[-1] if lines[-1] != error else ""
                (directory / f"{r.key}.txt").write_text(f"exit {done.returncode}: {error} {last}".strip() + "\n")


def load(out: Path, report: Report) -> tuple[Measured, dict[str, str]]:
    measured: Measured = {}
    failed: dict[str, str] = {}
    for r in report.runs:
        path, note = out / report.id / f"{r.key}.json", out / report.id / f"{r.key}.txt"
        if path.exists():
            result = Result.from_dict(json.loads(path.read_text()))
            measured[r.key] = {d.design: d for d in result.runs}
        elif note.exists():
            failed[r.key] = note.read_text().strip().replace("|", "\\|")
    return measured, failed


def _value(name: str, value: float | None) -> str:
    if "_ms_" not in name:
        return str(value)
    return "-" if value is None else "never" if math.isinf(value) else f"{value / 1000:.1f} s"


def _label(name: str) -> str:
    return name.replace("delay_lateness_ms_", "lateness ").replace("recovery_ms_", "recovery ").replace("_", " ")


def cell(run: DesignRun, show: tuple[str, ...]) -> str:
    parts = []
    for name in show:
        value = getattr(run.counts, name) if hasattr(run.counts, name) else getattr(run.timings, name)
        text = f"{_label(name)} {_value(name, value)}"
        if name == "stranded" and run.counts.stranded_at:
            text += f" ({', '.join(sorted(run.counts.stranded_at))})"
        parts.append(text)
    if not run.timings.drained:
        parts.append(f"**{run.timings.window_s:g} s window cut it short**")
    return f"`{run.design}`: " + ", ".join(parts)


def row(out: Path, report: Report) -> str:
    if report.skip:
        return f"| {report.links}: {report.claim} | - | - | {report.skip} | {report.fix} |"
    measured, failed = load(out, report)
    commands = "<br>".join(f"`{' '.join(r.command()[:-1])}`" for r in report.runs)
    claim, fixed = [], []
    for r in report.runs:
        if r.key in failed:
            (fixed if r.key.startswith("fix") else claim).append(f"{r.key}: {failed[r.key]}")
            continue
        for design, design_run in measured.get(r.key, {}).items():
            text = (f"{r.key}: " if len(report.runs) > 1 else "") + cell(design_run, report.show)
            (fixed if (r.key, design) in report.fixed else claim).append(text)
    complete = all(r.key in measured for r in report.runs)
    if not measured:
        verdict = "not decided: the run ended without a result" if failed else "not run yet"
        claim = claim or ["not run yet"]
    else:
        try:
            holds = report.holds(measured) if report.holds else None
            verdict = ("**holds**" if holds else "does not hold here") + f" ({report.rule})"
        except KeyError:
            verdict = "not decided: a run is missing"
        if not complete:
            verdict += "; some runs missing"
    fix = report.fix + ("<br>measured: " + "<br>".join(fixed) if fixed else "")
    return f"| {report.links}: {report.claim} | {commands} | {'<br>'.join(claim)} | {verdict} | {fix} |"


def table(out: Path) -> str:
    head = "| report | scenario (`crashbench compare ...`) | measured, per library | claim holds? (rule) | the fix |"
    return "\n".join([head, "| --- | --- | --- | --- | --- |", *(row(out, r) for r in REPORTS)])


def embed(doc: Path, text: str) -> None:
    page = doc.read_text()
    before, begin, rest = page.partition(MARK_BEGIN)
    _, end, after = rest.partition(MARK_END)
    if not begin or not end:
        sys.exit(f"{doc}: no markers {MARK_BEGIN!r} ... {MARK_END!r}")
    doc.write_text(f"{before}{MARK_BEGIN}\n{text}\n{MARK_END}{after}")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("run", "table"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    if argv[0] == "run":
        wp = argv[argv.index("--worker-python") + 1] if "--worker-python" in argv else None
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else []
        run(out, wp, only)
        return 0
    text = table(out)
    if "--doc" in argv:
        embed(Path(argv[argv.index("--doc") + 1]), text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
