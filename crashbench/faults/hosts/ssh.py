"""Hosts reached over SSH: a host's workers run on it (crashbench.control.sshworker: a stub here mirrors
each one), and its faults are commands over SSH, so the driver (crashbench.faults.hosts.inject) is the
one the namespace hosts use:

    boot      (at the start) a directory of the run's on the host (mktemp: under its TMPDIR, or /tmp),
              crashbench's own package shipped into it as a zip, the host's Python checked to import it
              and redis-py
    crash     every worker process crashbench started there SIGKILLed, each with its process group, in one
              command: as close to a host losing power as SSH can make (a VM's reset is another Host)
    pause     each of them SIGSTOPped, the command returning once the host's kernel reports them stopped
    cut/heal  iptables on the host drops its packets to and from the server's address and port, or (`from`)
              everything to and from the other hosts' addresses (root there)

`close` kills whatever is left, removes the rules and the directory: nothing is left on a host.
The server must be reachable from the hosts: `server` in the hosts' entry is its address as they see it;
a server crashbench starts is made to listen on it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from crashbench.control import ssh
from crashbench.control.ssh import SshError, SshTarget, quote
from crashbench.control.sshworker import RemoteSlot
from crashbench.faults import netns

PIDS = 'for f in "$1"/*/pid; do [ -f "$f" ] && kill -s {sig} -- -"$(cat "$f")" 2>/dev/null; done; true'


def with_host(url: str, host: str | None) -> str:
    """`url` with its host replaced (the address the hosts reach the server at), its port and auth kept."""
    if not host:
        return url
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth + '@' if auth else ''}{host}{':' + str(parts.port) if parts.port else ''}"
    return urlunsplit(parts._replace(netloc=netloc))


class SshHost:
    """One host over SSH: its target, the run's directory on it, and the server's address and port as the
    host reaches them (for its partitions)."""

    def __init__(self, index: int, slots: tuple[int, ...], target: SshTarget, server: tuple[str, int]) -> None:
        self.index, self.slots, self.target, self.server = index, slots, target, server
        self.root = ""
        self.peers: list[str] = []  # every host's address, by index (for a cut between hosts)
        self._cut, self._apart = False, ()
        self._up = False

    @property
    def up(self) -> bool:
        return self._up

    def start(self, package: Path) -> None:
        """The run's directory on the host, crashbench shipped into it, the host's Python checked."""
        self.root = ssh.run(self.target, "mktemp -d -t crashbench-XXXXXXXX").strip()
        zip_ = f"{self.root}/crashbench.zip"
        check = f"PYTHONPATH={quote(zip_)} {quote(self.target.python)} -c 'import redis, crashbench.run.remote'"
        try:
            ssh.run(self.target, check, put=package, to=zip_)
        except SshError as exc:
            raise SshError(
                f"host {self.index} ({self.target}) cannot run a crashbench worker: {exc}",
                hint=f"install redis-py for {self.target.python} there, or name another Python: python = ...",
            ) from None
        self._up = True

    def boot(self) -> None:
        self._up = True  # its workers are started by the run (the driver spawns one per slot)

    def _signal(self, sig: str) -> None:
        ssh.run(self.target, self._every(sig))

    def _every(self, sig: str) -> str:
        """The command that sends `sig` to every worker process group of the run on the host."""
        return f"sh -c {quote(PIDS.format(sig=sig))} sh {quote(self.root)}"

    def crash(self) -> None:
        self._signal("KILL")
        self._up = False

    def pause(self) -> int:
        zip_ = f"{self.root}/crashbench.zip"
        command = quote(self.target.python, "-m", "crashbench.run.remote", "signal", "STOP", self.root)
        out = ssh.run(self.target, f"PYTHONPATH={quote(zip_)} {command}")
        return len(out.split())

    def resume(self) -> None:
        self._signal("CONT")

    def _rules(self, op: str) -> str:
        """Its cut: to and from the server's port, or (`apart`) everything to and from those hosts."""
        tag = f"-m comment --comment crashbench-{Path(self.root).name} -j DROP"
        if self._apart:
            peers = [quote(self.peers[h]) for h in self._apart]
            rules = [f"iptables -w {op} {chain} {way} {p} {tag}" for p in peers
                     for chain, way in (("OUTPUT", "-d"), ("INPUT", "-s"))]  # fmt: skip
            return " && ".join(rules)
        ip, port = self.server
        out = f"iptables -w {op} OUTPUT -p tcp -d {quote(ip)} --dport {port} {tag}"
        inp = f"iptables -w {op} INPUT -p tcp -s {quote(ip)} --sport {port} {tag}"
        return f"{out} && {inp}"

    def cut(self, apart: Sequence[int] = ()) -> None:
        self._apart = tuple(apart)
        ssh.run(self.target, self._rules("-I"))
        self._cut = True

    def heal(self) -> None:
        if self._cut:
            ssh.run(self.target, self._rules("-D"))
            self._cut = False

    def close(self) -> None:
        """One command, one connection: its rules out (if cut), every worker left killed, its directory gone."""
        if self.root:
            heal = f"{{ {self._rules('-D')}; }} 2>/dev/null; " if self._cut else ""
            ssh.run(self.target, f"{heal}{self._every('KILL')}; rm -rf {quote(self.root)}")
            self._cut, self.root = False, ""


class SshHosts:
    """The run's hosts over SSH, from its layout and their targets (one per host); `close` ends them all."""

    def __init__(
        self, layout: Sequence[Sequence[int]], targets: Sequence[SshTarget], url: str, server: str | None,
        workdir: Path, bind: bool,
    ) -> None:  # fmt: skip
        if (reason := ssh.unavailable()) is not None:
            raise SshError(reason)
        self.url, self.server = url, server
        parts = urlsplit(with_host(url, server))
        address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.hosts = [SshHost(i, tuple(s), t, address) for i, (s, t) in enumerate(zip(layout, targets, strict=True))]
        self._of = {s: h for h in self.hosts for s in h.slots}
        for h in self.hosts:
            h.peers = [t.host for t in targets]
        self._before: dict[str, str] | None = None
        try:
            if bind and server:
                self._before = netns.bind_server(url, [server])
            package = ssh.package_zip(workdir)
            for h in self.hosts:
                h.start(package)
        except BaseException:
            self.close()
            raise

    def host_of(self, slot: int) -> SshHost | None:
        return self._of.get(slot)

    def place(self, slot: int) -> int | None:
        return None  # no PID namespace here: the worker is on the host

    def remote(self, slot: int) -> RemoteSlot | None:
        h = self._of.get(slot)
        return RemoteSlot(h.target, h.root) if h is not None else None

    def worker_url(self, url: str, slot: int) -> str | None:
        return with_host(url, self.server) if slot in self._of else None

    def enter(self, slot: int) -> None:
        return None

    def close(self) -> None:
        errors = []
        for h in self.hosts:
            try:
                h.close()
            except SshError as exc:
                errors.append(str(exc))
        if self._before is not None:
            netns.restore_server(self.url, self._before)
            self._before = None
        if errors:
            raise SshError("; ".join(errors))
