"""The network between a run's workers and its server, when the run has network faults. Two ways, one
per run:

- the fault proxy (crashbench.control.proxy) for Toxiproxy's toxics: one port per worker slot, then the
  producer's and the replica link's (the layout NetworkFaults expects); no root needed;
- one Linux network namespace per worker slot (crashbench.faults.netns) for the kernel's own faults:
  drop (a partition), reject, loss. Root and iptables needed, and a server crashbench started, since the
  server must also listen on the namespaces' addresses (CONFIG SET bind, protected-mode).

Workers connect through whichever the run uses (`worker_url`, and `enter` in the forked worker); without
network faults, directly. The harness's own connection never goes through either.

A run with hosts (crashbench.faults.hosts) has neither: a host's workers start in its PID namespace
(`pidns`) and connect from its network namespace, the server listening on the hosts' addresses.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from crashbench.control.proxyctl import ProxyProcess, proxy_for
from crashbench.errors import UsageError
from crashbench.faults import PARTITION_TOXICS, Fault
from crashbench.faults.hosts import layout as hosts_layout
from crashbench.faults.hosts import ssh_settings

if TYPE_CHECKING:
    from crashbench.control.sshworker import RemoteSlot
    from crashbench.faults.broker import Broker
    from crashbench.faults.hosts.machine import Hosts
    from crashbench.faults.hosts.ssh import SshHosts
    from crashbench.faults.netns import Partitions
    from crashbench.model.spec import Scenario


class RunNetwork:
    def __init__(self) -> None:
        self.proxy: ProxyProcess | None = None
        self.partitions: Partitions | None = None
        self.hosts: Hosts | SshHosts | None = None
        self.producer_url: str | None = None  # through the proxy, when a fault targets the producer
        self.proxied_workers = False
        self._url = ""
        self._before: dict[str, str] | None = None  # the server's bind and protected-mode, to restore

    @classmethod
    def start(
        cls, planned: list[Fault], url: str, sc: Scenario, broker: Broker | None, external: bool, logs: Path
    ) -> RunNetwork:
        """What the run's network faults need, started; nothing without any. Closed by `close`, also when
        starting fails half-way."""
        self = cls()
        self._url = url
        faults = [f for f in planned if f.kind == "network"]
        try:
            if (layout := hosts_layout(sc)) and (over := ssh_settings(sc)) is not None:
                self._ssh_hosts(layout, over, external, logs)
            elif layout:
                self._hosts(layout, external, logs)
            elif any(f.toxic["name"] in PARTITION_TOXICS for f in faults):
                self._partition(sc.workload.workers, external)
            elif faults:
                self._proxy(faults, url, sc.workload.workers, broker, logs)
        except BaseException:
            self.close()
            raise
        return self

    def _partition(self, workers: int, external: bool) -> None:
        from crashbench.faults import netns  # iptables and namespaces: only for the runs that use them

        if external:
            raise UsageError(
                "network partitions (drop, reject, loss) need a server crashbench starts: the server must "
                "also listen on the workers' namespace addresses, and crashbench changes no server it does "
                "not own",
                hint="leave out --redis-url, or use the proxy's toxics (timeout is a half-open connection)",
            )
        self.partitions = netns.Partitions.create(workers)
        self._before = netns.bind_server(self._url, self.partitions.host_addresses)

    def _hosts(self, layout: tuple[tuple[int, ...], ...], external: bool, logs: Path) -> None:
        from crashbench.faults.hosts.machine import Hosts

        if external:
            raise UsageError(
                "hosts need a server crashbench starts: the server must also listen on the hosts' addresses, "
                "and crashbench changes no server it does not own",
                hint="leave out --redis-url",
            )
        self.hosts = Hosts(layout, self._url, logs)

    def _ssh_hosts(self, layout: tuple[tuple[int, ...], ...], over: dict, external: bool, logs: Path) -> None:
        from crashbench.control.ssh import SshTarget
        from crashbench.faults.hosts.ssh import SshHosts

        keys = {k: over[k] for k in ("identity", "known_hosts", "python") if k in over}
        targets = [SshTarget.parse(t, **keys) for t in over["ssh"]]
        self.hosts = SshHosts(layout, targets, self._url, over.get("server"), logs, bind=not external)

    def remote(self, slot: int) -> RemoteSlot | None:
        """Where the slot's worker runs when it is on a host over SSH; None: here."""
        return self.hosts.remote(slot) if self.hosts is not None else None

    def pidns(self, slot: int) -> int | None:
        """The PID namespace of the slot's host, or None: the slot is on no host."""
        return self.hosts.place(slot) if self.hosts is not None else None

    def _proxy(self, faults: list[Fault], url: str, workers: int, broker: Broker | None, logs: Path) -> None:
        targets = {f.target for f in faults}
        self.proxy = proxy_for(url, workers + 2, logs / "proxy.log")
        self.proxied_workers = "workers" in targets
        if "replica" in targets and broker is not None:
            broker.relink_replica(self.proxy.ports[workers + 1])
        if "producer" in targets:
            self.producer_url = self.proxy.url(url, workers)

    def worker_url(self, url: str, slot: int) -> str | None:
        """The URL the worker in `slot` connects to, or None: `url` itself."""
        if self.proxy is not None and self.proxied_workers:
            return self.proxy.url(url, slot)
        if self.partitions is not None:
            return self.partitions.worker_url(url, slot)
        if self.hosts is not None:
            return self.hosts.worker_url(url, slot)
        return None

    def enter(self, slot: int) -> None:
        """In the forked worker, before it connects: into its slot's namespace, with partitions."""
        if self.partitions is not None:
            self.partitions.enter(slot)
        if self.hosts is not None:
            self.hosts.enter(slot)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        if self.hosts is not None:
            self.hosts.close()  # after the workers are stopped: whatever is left on a host dies with its init
        if self.partitions is not None:
            from crashbench.faults import netns

            try:
                if self._before is not None:
                    netns.restore_server(self._url, self._before)
            finally:
                self.partitions.close()
