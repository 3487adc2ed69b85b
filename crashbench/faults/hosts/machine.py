"""The run's hosts, each a Linux network namespace (its own address: crashbench.faults.netns, one "slot" of
its Partitions per host) and a PID namespace whose init crashbench starts (crashbench.control.pidns).

A host's workers are the runner's children, forked into its PID namespace (Supervisor's `place`) and
moved into its network namespace before they connect (`enter`): the supervisor waits for them, the
ledger files and the READY handshake are the same as on the machine itself. What a host is to the
faults is the `Host` protocol: boot, crash, pause and resume, cut and heal. `NamespaceHost` is this
machine's; `SshHost` (crashbench.faults.hosts.ssh) is a host over SSH (its workers started there, its
crash a kill of every process crashbench started there, its cut an iptables rule over the same channel),
and the driver (crashbench.faults.hosts.inject) is the same for both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from crashbench.control import pidns
from crashbench.faults import netns
from crashbench.faults.hosts import links


def unavailable() -> str | None:
    """None when this machine can make hosts, else one sentence saying why not."""
    reason = netns.unavailable()
    return None if reason is None else "hosts (a network and PID namespace each) cannot run here: " + reason


class HostDown(netns.NetnsError):
    """A worker was to start on a host that is down (crashed, not yet rebooted)."""


class Host(Protocol):
    """One host as the faults see it."""

    index: int
    slots: tuple[int, ...]

    @property
    def up(self) -> bool: ...

    def boot(self) -> None: ...  # a new init (after a crash: the reboot)

    def crash(self) -> None: ...  # every process on it dies at once

    def pause(self) -> int: ...  # every process on it stopped (the kernel says so); how many

    def resume(self) -> None: ...

    def cut(self, apart: Sequence[int] = ()) -> None: ...  # from the server; or from the hosts `apart`

    def heal(self) -> None: ...


class NamespaceHost:
    """A host on this machine: the network namespace `net`'s slot `index` of the run's Partitions (cut off
    from other hosts by `cuts`), and a PID namespace with its init (`init`, None while down)."""

    def __init__(self, index: int, slots: tuple[int, ...], net: netns.Partitions, logs: Path, cuts: links.Cuts) -> None:
        self.index, self.slots, self.net, self.logs, self.cuts = index, slots, net, logs, cuts
        self.init: pidns.Init | None = None
        self.dead: list[pidns.Init] = []  # crashed, reaped once their workers are
        self.boots = 0
        self.frozen: list[int] = []

    @property
    def up(self) -> bool:
        return self.init is not None

    def boot(self) -> None:
        self.dead = [i for i in self.dead if not i.reap(0.0)]
        if self.init is None:
            self.boots += 1
            self.init = pidns.Init.start(self.logs / f"host{self.index}-init{self.boots}.log")

    def crash(self) -> None:
        if self.init is not None:
            self.init.kill()
            self.dead.append(self.init)
            self.init = None

    def reap(self, timeout: float) -> bool:
        """Reap its crashed inits (each once the workers forked into it are reaped); whether all were."""
        self.dead = [i for i in self.dead if not i.reap(timeout)]
        return not self.dead

    def processes(self) -> list[int]:
        return pidns.members(self.init) if self.init is not None else []

    def pause(self) -> int:
        self.frozen = freeze(self)
        return len(self.frozen)

    def resume(self) -> None:
        thaw(self.frozen)
        self.frozen = []

    def cut(self, apart: Sequence[int] = ()) -> None:
        if apart:
            self.cuts.cut(self.index, apart)
        else:
            self.net.apply(self.index, "drop")

    def heal(self) -> None:
        self.cuts.heal(self.index)
        self.net.heal(self.index)

    def place(self) -> int:
        """Its PID namespace, for a worker starting on it."""
        if self.init is None:
            raise HostDown(f"a worker was to start on host {self.index}, which is down (crashed, not yet rebooted)")
        return self.init.ns

    def address(self) -> str:
        return self.net.worker_address(self.index)


class Hosts:
    """The run's hosts from its layout (a tuple of slot tuples, one per host), booted; `close` ends them all
    (idempotent), the namespaces, the rules and the server's bind with them."""

    def __init__(self, layout: Sequence[Sequence[int]], url: str, logs: Path) -> None:
        self.url = url
        if (reason := unavailable()) is not None:
            raise netns.NetnsError(reason)
        self.net = netns.Partitions.create(len(layout))
        self.hosts: list[NamespaceHost] = []
        self._before: dict[str, str] | None = None
        try:
            self._before = netns.bind_server(url, self.net.host_addresses)
            links.route(self.net)  # the hosts reach each other, as machines on one LAN
            cuts = links.Cuts(self.net)
            self.hosts = [NamespaceHost(i, tuple(slots), self.net, logs, cuts) for i, slots in enumerate(layout)]
            for h in self.hosts:
                h.boot()
        except BaseException:
            self.close()
            raise
        self._of = {s: h for h in self.hosts for s in h.slots}

    def host_of(self, slot: int) -> NamespaceHost | None:
        return self._of.get(slot)

    def place(self, slot: int) -> int | None:
        """The slot's PID namespace (None: it is on no host, and runs on the machine itself)."""
        h = self._of.get(slot)
        return h.place() if h is not None else None

    def remote(self, slot: int) -> None:
        """No slot's worker runs elsewhere: each is forked here into its host (SshHosts' run on theirs)."""
        return None

    def worker_url(self, url: str, slot: int) -> str | None:
        h = self._of.get(slot)
        return self.net.worker_url(url, h.index) if h is not None else None

    def enter(self, slot: int) -> None:
        """In the forked worker: into its host's network namespace."""
        if (h := self._of.get(slot)) is not None:
            self.net.enter(h.index)

    def close(self) -> None:
        """After the workers are stopped and reaped: every process still on a host dies with its init."""
        for h in self.hosts:
            h.crash()
        stuck = [h.index for h in self.hosts if not h.reap(5.0)]
        try:
            if self._before is not None:
                netns.restore_server(self.url, self._before)
                self._before = None
        finally:
            self.net.close()
        if stuck:  # a worker on it was never reaped: its init cannot go before it
            raise netns.NetnsError(f"the init of host {', '.join(map(str, stuck))} did not end within 5 s")


def freeze(host: NamespaceHost, timeout: float = 1.0) -> list[int]:
    """SIGSTOP every process on the host and wait until the kernel reports each stopped; listed again until
    no new one appears (one forked meanwhile: a stopped process forks no more). Returns them all."""
    stopped: list[int] = []
    while new := [p for p in host.processes() if p not in stopped]:
        stopped += _stop(new, timeout)
    return stopped


def _stop(pids: list[int], timeout: float) -> list[int]:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    waiting = list(pids)
    while waiting and time.monotonic() < deadline:
        waiting = [p for p in waiting if _state(p) not in ("T", "t", "Z", "X", "")]
        if waiting:
            time.sleep(0.0005)
    return pids


def thaw(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    """The process's state letter (/proc/<pid>/stat), "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""
