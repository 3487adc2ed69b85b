"""The last piece of a crash run: the harness's final reading of Redis, and everything the run recorded
gathered into its timeline (crashbench.model.timeline), on the timeline's clock, which the result is
computed from (crashbench.evidence.tally)."""

from __future__ import annotations

from typing import Any

from crashbench.faults import registry
from crashbench.model.queue import Located, carry
from crashbench.model.timeline import DesignFlags, Enqueue, Mark, Spawn, Timeline, rel
from crashbench.model.workload import job_ids
from crashbench.run import reading

# The crash run these read (crashbench.run.runner.CrashRun, which calls them): named, not imported.
CrashRun = Any


DUE_MARGIN_S = 1.0  # a library's scheduler polls once a second (RQ, huey, saq)


def last_due(run: CrashRun) -> float:
    """The harness-clock time the run's last delayed job is due, plus DUE_MARGIN_S; 0 without delays."""
    delay = run.sc.workload.delay_s
    if not delay:
        return 0.0
    sent = run.producer.chunks if run.producer is not None else run.enqueues
    return max((t for t, *_ in sent), default=run.t0) + delay + DUE_MARGIN_S


def final_reading(run: CrashRun) -> reading.Reading:
    """The design's reading of its keys, corrected by the harness's search of everything in scope for
    the run's token (crashbench.run.reading), and the problems where the two disagree."""
    url = run.broker.url if run.broker is not None else run.target.url
    read = reading.final(run.design, run.raw, run.needle, run.scope, url, run.ledger.has_completed)
    run.inspect_s += read.spent_s
    return read


def timeline(
    run: CrashRun, drained: bool, cut_off: bool, drained_at: float, faults_end: float,
    settled: tuple[float, int, list[str]] | None, before: Located,
) -> Timeline:  # fmt: skip
    """Everything the run recorded, on the timeline's clock, with the harness's final reading of Redis
    (what it held before the workers were stopped, and found nowhere after, counted there)."""
    state = run.design.state().canonical()
    after = final_reading(run)
    located, reading_problems = carry(before, after.located, run.ledger.has_completed), after.problems
    t0 = run.t0
    history: dict[str, Any] = {"fault_events": []}
    for f in registry.FAMILIES:
        if (d := run.drivers.get(f.name)) is not None:
            for k, v in f.history(d).items():  # its own fields; its own events beside every family's
                history[k] = history[k] + v if k == "fault_events" else v
    if run.producer is not None:
        enqueues = [Enqueue(rel(t, t0), chunk, ok, lag, e) for t, chunk, ok, lag, e in run.producer.chunks]
    else:
        enqueues = [Enqueue(rel(t, t0), chunk, entries=e) for t, chunk, e in run.enqueues]
    cls = run.design_cls
    flags = DesignFlags(cls.drops_failed, cls.own_worker, cls.exactly_once, cls.counts_requeues)
    return Timeline(
        index=run.target.index, spec=run.spec, variant=run.target.variant, prefix=run.prefix, repeat=run.target.repeat,
        scenario=run.sc.to_dict(), design=flags,
        t0=t0, started=run.started, window=run.window, produced=run.producer is not None,
        configuration=run.configuration, warnings=run.warnings, enqueues=enqueues,
        spawns=[Spawn(rel(w.spawned_at, t0), w.name, w.slot, w.pid) for w in run.sup.workers],
        ready={w.name: rel(r, t0) for w in run.sup.workers if (r := run.ledger.ready_at(w.name)) is not None},
        executions=run.ledger.hand_over(t0),
        ledger_problems=list(run.ledger.problems), planned=run.planned,
        marks=sorted(
            [Mark(rel(t, t0), what, n) for t, what, n in run.marks]
            + [Mark(rel(t, t0), f"resume {worker}") for t, worker in run.worker_faults.healed],
            key=lambda m: m.t,
        ),
        depth=run.sampler.samples,
        exits=run.exits, located=located, state=state, reading_problems=reading_problems,
        faults_end=rel(faults_end, t0), drained_at=rel(drained_at, t0), drained=drained, cut_off=cut_off,
        settled_at=None if settled is None else rel(settled[0], t0),
        backlog_after=-1 if settled is None else settled[1], held_at_drain=None if settled is None else settled[2],
        inspect_s=round(run.inspect_s, 4), effects=run.app.effects(job_ids(run.sc.workload.jobs)),
        workdir=str(run.dir) if run.keep_dir else None,
        **history,
    )  # fmt: skip
