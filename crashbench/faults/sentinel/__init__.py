"""The sentinel family: automatic failover as production runs it, Redis Sentinel's (issue 30). One
package: the topology as a run's broker (broker.py), and a module per fault (kill.py, ...).

    sentinel-kill   SIGKILL the primary of the run's own Sentinel topology (crashbench.control.sentinel)
                    at `fault_at`. The sentinels find it down after DOWN_AFTER_MS, agree (a quorum of 2 of
                    3) and promote a replica on their own (+switch-master): nothing of crashbench's promotes
                    anything, and nobody tells the clients where the new primary is.

A run with this fault gets a private topology, as every broker fault gets private servers (refused with
--redis-url and on a cluster). crashbench's own workers connect through the topology's `redis+sentinel://`
URL (crashbench.control.connect), whose client asks the sentinels for the primary again after a
connection error, as an application configured with Sentinel does; the harness reads the primary the
sentinels name. The library adapters' workers connect through their library's own Sentinel configuration
(crashbench.designs.sentinels).

History: the broker fault's record (crashbench.model.faults.BrokerFaultRecord): when the primary was
killed, what the harness read it held just before (its writes paused meanwhile, as for a broker kill),
the enqueues acknowledged by then, and `back_at`, when the sentinels first named another primary (the
promotion time is back_at - at); marks "down" and "promoted". Counts: the broker checker's
(crashbench.faults.servers), the outage drawn as the broker's band.
"""

from __future__ import annotations

import random
from typing import Any

from crashbench.faults import servers
from crashbench.faults.family import Driver, Entry, FaultFamily
from crashbench.faults.sentinel.broker import SentinelBroker, sentinel_broker
from crashbench.faults.sentinel.kill import KIND, SentinelFaults
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario

__all__ = ["FAMILY", "SentinelBroker", "sentinel_broker"]
KEYS = ("kind", "at")


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
