"""The sentinel family: automatic failover as production runs it, Redis Sentinel's (issue 30).

    sentinel-kill   SIGKILL the primary of the run's own Sentinel topology (crashbench.control.sentinel)
                    at `fault_at`. The sentinels find it down after DOWN_AFTER_MS, agree (a quorum of 2 of
                    3) and promote a replica on their own (+switch-master): nothing of crashbench's promotes
                    anything, and nobody tells the clients where the new primary is.

A run with this fault gets a private topology, as every broker fault gets private servers (refused with
--redis-url and on a cluster). crashbench's own workers connect through the topology's `redis+sentinel://`
URL (crashbench.control.connect), whose client asks the sentinels for the primary again after a
connection error, as an application configured with Sentinel does; the harness reads the primary the
sentinels name. The library adapters are refused until each one's own Sentinel configuration is built.

History: the broker fault's record (crashbench.model.faults.BrokerFaultRecord): when the primary was
killed, what the harness read it held just before (its writes paused meanwhile, as for a broker kill),
the enqueues acknowledged by then, and `back_at`, when the sentinels first named another primary (the
promotion time is back_at - at); marks "down" and "promoted". Counts: the broker checker's
(crashbench.faults.servers), the outage drawn as the broker's band.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from crashbench.control import workdirs
from crashbench.control.sentinel import MASTER_NAME, SentinelTopology, sentinel_topology
from crashbench.faults import servers
from crashbench.faults.broker import pause_writes
from crashbench.faults.family import Driver, Entry, FaultFamily
from crashbench.model.faults import BrokerFaultRecord, Fault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import rel

KIND = "sentinel-kill"
KEYS = ("kind", "at")
JOB_SAMPLE = 100  # held ids kept in the record, as the broker family keeps them


class SentinelBroker:
    """A run's topology as its broker: workers get the Sentinel URL (its file), the harness the primary's."""

    def __init__(self, topology: SentinelTopology, url_file: Path) -> None:
        self.topology = topology
        self.url_file = url_file
        hosts = ",".join(f"{host}:{port}" for host, port in topology.sentinel_addresses)
        self.sentinel_url = f"redis+sentinel://{hosts}/{MASTER_NAME}/0"
        url_file.write_text(self.sentinel_url)
        self.primary = topology.primary_address()

    @property
    def url(self) -> str:
        """The primary the sentinels named when last asked (`promoted`), as a plain URL for the harness."""
        host, port = self.primary
        return f"redis://{host}:{port}/0"

    def promoted(self) -> bool:
        """Whether the sentinels name another primary than before; if so, it is the harness's from now on."""
        try:
            now = self.topology.primary_address()
        except redis.RedisError:
            return False
        changed, self.primary = now != self.primary, now
        return changed


@contextlib.contextmanager
def sentinel_broker(binary: str | None) -> Iterator[SentinelBroker]:
    """A private topology for one crash run, stopped and removed on exit."""
    home = workdirs.make("broker")
    try:
        with sentinel_topology(binary) as topology:
            yield SentinelBroker(topology, home / "server.url")
    finally:
        shutil.rmtree(home, ignore_errors=True)


class SentinelFaults:
    """Kill the primary at the fault's time; the fault lasts until the sentinels name another one."""

    fine = False  # stepped once a tick (crashbench.faults.family.Driver)

    def __init__(self, fault: Fault, run: Any) -> None:
        self.fault, self.broker, self.producer = fault, run.broker, run.producer
        self.locate, self.reconnect, self.mark, self.clock = run.locate, run.reconnect, run.mark, run.clock
        self.persistence = run.sc.broker.persistence
        self.t0 = run.t0
        self.record: BrokerFaultRecord | None = None
        self.held_at_fault: set[str] = set()
        self.held_after_promotion: set[str] = set()

    @property
    def down(self) -> bool:
        return self.record is not None and self.record.back_at is None

    @property
    def done(self) -> bool:
        return self.producer.done and self.record is not None and self.record.back_at is not None

    def step(self, now: float) -> None:
        if self.record is None and now >= self.t0 + self.fault.at:
            primary = self.broker.topology.primary
            pause_writes(primary.url)  # the harness's reading as the primary dies is a snapshot
            self.held_at_fault = held = set(self.locate().held)
            now = self.clock()
            self.record = BrokerFaultRecord(
                KIND, self.persistence, rel(now, self.t0), len(held), sorted(held)[:JOB_SAMPLE],
                self.producer.acknowledged,
            )  # fmt: skip
            primary.kill()
            self.mark(now, "down")
        elif self.down and self.broker.promoted():
            back = self.clock()
            assert self.record is not None
            self.record.back_at = rel(back, self.t0)
            self.mark(back, "promoted")
            self.reconnect()


def section(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
    b = sc.broker
    return [Fault(start, b.fault_at, KIND)] if b.fault == KIND else []


def fields(entry: Entry) -> dict[str, Any]:
    return {"fault": KIND, **({"fault_at": entry["at"]} if "at" in entry else {})}


def driver(run: Any) -> Driver | None:
    fault = next((f for f in run.planned if f.kind == KIND), None)
    if fault is None or not isinstance(run.broker, SentinelBroker) or run.producer is None:
        return None
    return SentinelFaults(fault, run)


def history(d: Driver) -> dict[str, Any]:
    return {
        "broker_fault": d.record,  # type: ignore[attr-defined]
        "held_at_fault": sorted(d.held_at_fault),  # type: ignore[attr-defined]
    }


FAMILY = FaultFamily(
    name="sentinel",
    summary="SIGKILL the primary of the run's own Sentinel topology; the sentinels promote a replica on their own",
    kinds=(KIND,),
    keys=KEYS,
    section=section,
    fields=fields,
    on_server=True,
    driver=driver,
    history=history,
    checkers=servers.BROKER.checkers,
    bands=servers.outage_bands((KIND,)),
)
