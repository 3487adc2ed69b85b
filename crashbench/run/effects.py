"""A run of the user's own app ([app]: crashbench.designs.app), the harness's side: each job's payload
(put in the job, where the library adapter reads it at enqueue), and, once the workers are stopped,
the user's own evidence: their check called with every job's payload, the answers kept in the timeline
(`effects`) for crashbench.evidence.effects to count. The check reads the user's system of record,
which the queue under test does not control."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashbench.designs import app as user
from crashbench.errors import UsageError
from crashbench.jobids import plain, wire
from crashbench.model.queue import Job
from crashbench.model.spec import Scenario
from crashbench.model.workload import jobs_for


class AppRun:
    """The [app] of one run: built before anything starts, so a payload file or a check that cannot be
    loaded is one line (exit 2) before any worker runs."""

    def __init__(self, sc: Scenario, token: str) -> None:
        spec = sc.app
        self.token = token
        self.workload = sc.workload_model()  # each job's delay (workload.delay_s)
        self.pad = sc.workload.payload_bytes
        self.on = bool(spec.task)
        self.payloads = user.Payloads(spec.payloads, sc.workload.jobs) if self.on else None
        self.check_spec = spec.check
        self.check = user.check_function(spec.check) if spec.check else None

    def jobs_for(self, ids: Sequence[str]) -> list[Job]:
        """The jobs of these ids: with an app, each carries its payload (JSON), else its number."""
        if self.payloads is None:
            return jobs_for(ids, token=self.token, workload=self.workload, pad=self.pad)
        text, delay = self.payloads.text, self.workload.delay_of
        return [Job(wire(j, self.token), text(int(j)), delay_s=delay(j)) for j in ids]

    def effects(self, ids: Sequence[str]) -> dict[str, Any] | None:
        """The check's answer for every enqueued job: how many checked, and each job whose effect does
        not exist exactly once, with its count; None without a check."""
        if self.check is None or self.payloads is None:
            return None
        counts: dict[str, int] = {}
        for job in ids:
            n = int(plain(job))
            payload = self.payloads.payload(n)
            try:
                answer = self.check(payload)
            except Exception as exc:  # the user's code: one line naming it, never a traceback
                raise UsageError(f"check {self.check_spec} raised for job {n}: {type(exc).__name__}: {exc}") from None
            if (count := user.effect_count(answer, self.check_spec, n)) != 1:
                counts[job] = count
        return {"check": self.check_spec, "checked": len(ids), "counts": counts}
