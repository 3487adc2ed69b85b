"""The power family: a power cut under the server (issue 31). A SIGKILL of redis-server loses nothing
that reached the kernel; a power cut loses what was not fsynced.

    power-loss  the run's private server keeps its data on a lazy file system (crashbench.control.lazyfs,
                FUSE) that remembers what each file had durable at its last fsync. At `fault_at` the
                server is SIGKILLed and every file cut back to its durable length; `downtime` later the
                server starts again on what is left, and the run drains as after a broker-kill.

Its driver is the broker family's (crashbench.faults.injector.BrokerFaults: the harness's reading of
what the server held, the producer enqueueing over the fault), its record the broker fault's, and its
counts the broker checker's (crashbench.faults.servers), and its own: by id, what the cut took from the
disk, read from the AOF's bytes, the file system's fsyncs and the durable state
(crashbench.faults.power.cut). `power_cut = "torn"` keeps part of a page of the unsynced bytes too.
It needs root, /dev/fuse, fusermount3 and mfusepy (`unavailable()`); a run asking for it elsewhere is
refused with the reason.
"""

from __future__ import annotations

import random
from typing import Any

from crashbench.control.lazyfs import unavailable
from crashbench.faults import servers
from crashbench.faults.family import Driver, FaultFamily
from crashbench.faults.power import cut
from crashbench.faults.power.broker import PowerBroker, power_servers
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario

__all__ = ["FAMILY", "KIND", "PowerBroker", "power_servers", "unavailable"]
KIND = "power-loss"
_broker_driver = servers._driver(on_cluster=False, kinds=(KIND,))


def _driver(run: Any) -> Driver | None:
    """The broker family's driver (BrokerFaults) on the run's PowerBroker, which at the cut reads what the
    disk kept with the run's token and the design's own reading (crashbench.faults.power.broker)."""
    d = _broker_driver(run)
    if d is not None and isinstance(run.broker, PowerBroker):
        run.broker.needle = run.needle
        run.broker.reader = lambda raw: set(run.locate(raw).held)
    return d


def _history(d: Driver) -> dict[str, Any]:
    return {**servers.history(d), **cut.history(d)}


def section(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
    b = sc.broker
    return [Fault(start, b.fault_at, KIND, duration=b.downtime)] if b.fault == KIND else []


FAMILY = FaultFamily(
    name="power",
    summary="SIGKILL the embedded server, cut its files back to what was fsynced (a lazy FUSE file system), restart it",
    kinds=(KIND,),
    keys=("kind", "at", "downtime"),
    section=section,
    checkers=(*servers.BROKER.checkers, cut.power),
    bands=servers.outage_bands((KIND,)),
    fields=servers.fields,
    on_server=True,
    driver=_driver,
    history=_history,
    rows=(
        ("enqueues the cut took", "enqueues_cut", False),
        ("acks the cut took", "acks_cut", False),
        ("  ran again", "acks_cut_reran", False),
    ),
)
