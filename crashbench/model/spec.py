"""The spec: what a run is asked to do, as a scenario file says it (crashbench.scenario parses and
validates the TOML into this record). It holds the file's sections, in the file's order, each a
record of its own (crashbench.model.sections): workload (what the jobs are), faults (the worker
signals), queue (the design's settings), broker (the server's own fault), run (designs and the
observation window), app (the user's own app and task); then expect (thresholds per design) and
library (a library's own settings per design). Every field has a default (the lesson's crash test).
A result stores it flat, one name per key (`to_dict`: `jobs`, not `workload.jobs`), and `from_dict`
reads it back for a replay or a recount; `of`, `replace` and `value` take the same flat names.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from crashbench.model import thresholds
from crashbench.model.faults import BROKER_KILL
from crashbench.model.queue import DesignSettings
from crashbench.model.sections import FIELD_SECTION as FIELD_SECTION
from crashbench.model.sections import SECTION_RECORDS as SECTION_RECORDS
from crashbench.model.sections import AppSpec as AppSpec
from crashbench.model.sections import BrokerSpec as BrokerSpec
from crashbench.model.sections import FaultsSpec as FaultsSpec
from crashbench.model.sections import QueueSpec as QueueSpec
from crashbench.model.sections import RunSpec as RunSpec
from crashbench.model.sections import WorkloadSpec as WorkloadSpec
from crashbench.model.sections import flat
from crashbench.model.thresholds import Threshold
from crashbench.model.workload import Workload, job_ids

# What a design's settings take from the scenario as they are, by name: every DesignSettings field
# that is a key of [queue] or [broker]; settings() derives the rest.
_SETTINGS = {f.name for f in dataclasses.fields(DesignSettings)} & {
    name for name, section in FIELD_SECTION.items() if section in ("queue", "broker")
}
_WORKLOAD = {f.name for f in dataclasses.fields(Workload)} - {"seed"}  # from [workload]; the seed is [faults]'


@dataclass(frozen=True)
class Scenario:
    name: str = "lesson"
    description: str = "The lesson's crash test: 2,000 jobs of 10 ms, 4 workers, a SIGKILL every 0.5 s, 5 kills"
    source: str = "(defaults)"
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    faults: FaultsSpec = field(default_factory=FaultsSpec)
    queue: QueueSpec = field(default_factory=QueueSpec)
    broker: BrokerSpec = field(default_factory=BrokerSpec)
    run: RunSpec = field(default_factory=RunSpec)
    app: AppSpec = field(default_factory=AppSpec)
    expect: dict[str, tuple[Threshold, ...]] = field(default_factory=dict)  # design -> its thresholds
    library: dict[str, dict[str, Any]] = field(default_factory=dict)  # design -> the library's own settings

    @classmethod
    def of(cls, **values: Any) -> Scenario:
        """The defaults with the given fields, named flat (`jobs=10`, as `to_dict` names them)."""
        return cls().replace(**values)

    def replace(self, **values: Any) -> Scenario:
        """A copy with the given fields replaced, named flat: each goes into its section's record.
        An unknown name is a TypeError, as dataclasses.replace makes it."""
        top: dict[str, Any] = {}
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            if name in FIELD_SECTION:
                by_section.setdefault(FIELD_SECTION[name], {})[name] = value
            else:
                top[name] = value
        sections = {s: dataclasses.replace(getattr(self, s), **changed) for s, changed in by_section.items()}
        return dataclasses.replace(self, **top, **sections)

    def value(self, name: str) -> Any:
        """A field by its flat name (`jobs`: workload.jobs; `name`: the scenario's own)."""
        section = FIELD_SECTION.get(name)
        return getattr(getattr(self, section) if section else self, name)

    def settings(self, design: str = "") -> DesignSettings:
        """What `design` reads: the [queue] and [broker] keys DesignSettings has, its [library] table, and
        what follows from the rest (the stream trim, the workload's longest handler)."""
        given = {k: v for section in (self.queue, self.broker) for k, v in flat(section).items() if k in _SETTINGS}
        return DesignSettings(
            **given,
            app=self.app.app,
            task=self.app.task,
            options=self.library.get(design, {}),
            stream_approximate=self.queue.stream_trim == "approximate",
            longest_job=self.workload.longest_job_s,
            delayed=bool(self.workload.delay_s),
        )

    def workload_model(self) -> Workload:
        """What each job does (crashbench.model.workload): the [workload] keys it has, and the seed."""
        given = {k: v for k, v in flat(self.workload).items() if k in _WORKLOAD}
        return Workload(**given, seed=self.faults.seed)

    @property
    def ideal_s(self) -> float:
        """Wall time with every worker busy all the time: the sum of all handler durations / workers."""
        w = self.workload
        if w.job_dist == "fixed":
            return w.jobs * w.job_ms / 1000 / w.workers
        model = self.workload_model()
        return sum(model.duration_s(j) for j in job_ids(w.jobs)) / w.workers

    def to_dict(self) -> dict[str, Any]:
        """Flat: every section's fields by name, in the sections' order, between the scenario's own."""
        data: dict[str, Any] = {"name": self.name, "description": self.description, "source": self.source}
        for section in SECTION_RECORDS:
            data.update(dataclasses.asdict(getattr(self, section)))
        data["designs"] = list(self.run.designs)
        data["expect"] = {d: [t.rule() for t in ts] for d, ts in self.expect.items()}
        data["library"] = copy.deepcopy(self.library)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        """The scenario a result recorded (`to_dict`), to replay one of its runs."""
        known = {f.name for f in dataclasses.fields(cls)} - set(SECTION_RECORDS) | set(FIELD_SECTION)
        values = {k: v for k, v in data.items() if k in known}
        values["designs"] = tuple(values.get("designs", ()))
        values["schedule"] = tuple(values.get("schedule", ()))
        values["expect"] = {
            d: tuple(thresholds.parse(rule, design=d, source="scenario") for rule in rules)
            for d, rules in values.get("expect", {}).items()
        }
        return cls.of(**values)

    def fingerprint(self) -> str:
        """Identifies what was run, so results of the same scenario can be found and compared; the
        name, description, source and seed do not change what is measured, so they are left out."""
        data = self.to_dict()
        for key in ("name", "description", "source", "seed"):
            data.pop(key)
        # Settings added later, at their defaults: older results keep their fingerprint.
        later = (("shards", 0), ("stream_maxlen", 0), ("stream_trim", "exact"), ("produce", "before"),
                 ("crash_rate", 0.0), ("crash_how", "sigkill"), ("job_work", "sleep"), ("delay_s", 0.0),
                 ("delay_share", 1.0),
                 ("payload_bytes", 0), ("maxmemory", "used+1mb"), ("maxmemory_policy", "allkeys-lru"),
                 ("fill", "neighbour"), ("neighbour_ttl", 0.0), ("limit_s", 1.0),
                 ("failover_address", "new"), ("topology", "single"), ("min_replicas_to_write", 0),
                 ("min_replicas_max_lag", 1), ("minority_workers", 0), ("power_cut", "clean"),
                 ("wait_aof", 0), ("writeback", 30.0))  # fmt: skip
        for key, default in (*later, *((name, "") for name in flat(AppSpec()))):
            if data[key] == default:
                data.pop(key)
        if data["fault"] == BROKER_KILL:  # hashed by its old name: older results keep their fingerprint
            data["fault"] = "kill"
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
        return digest[:12]
