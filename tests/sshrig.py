"""Hosts for the SSH tests: each a network namespace (crashbench.faults.netns's Partitions) running Debian's
OpenSSH server, reached from here at its own address, as a real host would be; the server's address as
the hosts see it is the first namespace's address on this side (each namespace routes to it). Keys are
made for the rig (asyncssh): a client key, a host key per rig, a known_hosts file naming both hosts.
Each host's sessions get TMPDIR set to a directory of the rig's, so what a run leaves there is seen.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from crashbench.control.ssh import _asyncssh
from crashbench.faults import netns

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def unavailable() -> str | None:
    if (reason := netns.unavailable()) is not None:
        return reason
    if not os.access(SSHD, os.X_OK):
        return "no sshd (Debian's openssh-server): make system-deps installs it as root"
    return None


@dataclass
class Rig:
    net: netns.Partitions
    dir: Path
    identity: Path
    known_hosts: Path
    daemons: list[subprocess.Popen]

    def target(self, host: int) -> str:
        return f"root@{self.net.worker_address(host)}"

    @property
    def server(self) -> str:
        return self.net.host_address(0)

    def tmp(self, host: int) -> Path:
        return self.dir / f"tmp{host}"

    def settings(self, **extra: object) -> dict[str, object]:
        """The hosts entry's SSH keys for this rig (the workers under this interpreter, as on a host with it)."""
        return {"ssh": [self.target(i) for i in range(self.net.slots)], "identity": str(self.identity),
                "known_hosts": str(self.known_hosts), "python": sys.executable,
                "server": self.server, **extra}  # fmt: skip

    def processes(self, host: int) -> list[str]:
        """crashbench's processes on the host (its workers and their commands), each as its command line."""
        out = subprocess.run(["ip", "netns", "pids", self.net.namespace(host)], capture_output=True, text=True)
        found = []
        for p in out.stdout.split():
            with contextlib.suppress(OSError):
                line = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                if "crashbench" in line:
                    found.append(line)
        return found

    def leftovers(self) -> list[str]:
        """What a run left on the hosts: processes, files in their TMPDIR, iptables rules."""
        left = [f"host {i}: {p}" for i in range(self.net.slots) for p in self.processes(i)]
        left += [f"host {i}: {f}" for i in range(self.net.slots) for f in self.tmp(i).iterdir()]
        for i in range(self.net.slots):
            rules = subprocess.run(["ip", "netns", "exec", self.net.namespace(i), "iptables", "-S"],
                                   capture_output=True, text=True).stdout  # fmt: skip
            left += [f"host {i}: {r}" for r in rules.splitlines() if "crashbench" in r]
        return left


@contextlib.contextmanager
def rig(hosts: int, base: Path, skew: tuple[float, ...] = ()) -> Iterator[Rig]:
    """`skew`: each host's CLOCK_MONOTONIC ahead of this machine's by that many seconds (a time namespace)."""
    asyncssh = _asyncssh()
    net = netns.Partitions.create(hosts)
    daemons: list[subprocess.Popen] = []
    try:
        client, host_key = asyncssh.generate_private_key("ssh-ed25519"), asyncssh.generate_private_key("ssh-ed25519")
        identity, hostfile = base / "id", base / "host_key"
        client.write_private_key(str(identity))
        host_key.write_private_key(str(hostfile))
        for f in (identity, hostfile):
            f.chmod(0o600)
        (base / "authorized_keys").write_bytes(client.export_public_key())
        public = host_key.export_public_key().decode().strip()
        known = base / "known_hosts"
        known.write_text("".join(f"{net.worker_address(i)} {public}\n" for i in range(hosts)))
        Path("/run/sshd").mkdir(exist_ok=True)  # the server's privilege separation directory
        for i in range(hosts):
            subprocess.run(["ip", "-n", net.namespace(i), "route", "add", "default", "via", net.host_address(i)],
                           check=True)  # fmt: skip
            (tmp := base / f"tmp{i}").mkdir()
            conf = base / f"sshd{i}.conf"
            conf.write_text(
                f"ListenAddress {net.worker_address(i)}:22\nHostKey {hostfile}\nPidFile {base}/sshd{i}.pid\n"
                f"AuthorizedKeysFile {base}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                f"Subsystem sftp internal-sftp\nSetEnv TMPDIR={tmp}\nMaxStartups 100\nMaxSessions 100\n"
            )
            log = base / f"sshd{i}.log"
            with log.open("w") as err:
                ahead = skew[i] if i < len(skew) else 0
                clock = ["unshare", "--time", "--fork", "--monotonic", str(int(ahead))] if ahead else []
                argv = ["ip", "netns", "exec", net.namespace(i), *clock, SSHD, "-D", "-e", "-f", str(conf)]
                d = subprocess.Popen(argv, stderr=err)
            daemons.append(d)
            deadline = time.monotonic() + 30
            while "Server listening" not in log.read_text():  # its own word that it listens
                if d.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd in {net.namespace(i)} did not start: {log.read_text()[-300:]}")
                time.sleep(0.005)
        yield Rig(net, base, identity, known, daemons)
    finally:
        for i, d in enumerate(daemons):
            out = subprocess.run(["ip", "netns", "pids", net.namespace(i)], capture_output=True, text=True).stdout
            for p in out.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(p), signal.SIGKILL)
            d.wait()
        net.close()
