"""SSH to the hosts a run's workers run on (asyncssh, `pip install 'crashbench[ssh]'`), as Jepsen's
control layer reaches its nodes: a target (`[user@]host[:port]`, a private key file, a known_hosts file,
the host's Python), one command on it (`run`, with a file copied first), and the zip of crashbench itself
that a host's workers import (`package_zip`). A worker's own connection is its stub's
(crashbench.control.sshworker).

No password is ever asked, sent or kept: a key file (or the user's agent and default keys) only; the
server's key is checked against known_hosts unless `known_hosts = "none"` says not to (a lab's
throwaway hosts). The key's path is kept, never the key.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashbench.errors import RunAborted

CONNECT_TIMEOUT = 10.0
TARGET = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\])(?::(?P<port>\d{1,5}))?$"
)


class SshError(RunAborted):
    """A host could not be reached, or a command on it failed."""


def unavailable() -> str | None:
    """None when asyncssh can be imported, else why not, in one sentence."""
    try:
        _asyncssh()
    except ImportError:
        return "workers over SSH need asyncssh: pip install 'crashbench[ssh]'"
    return None


def _asyncssh() -> Any:
    with warnings.catch_warnings():  # cryptography's deprecation of DSA, which asyncssh still names
        warnings.simplefilter("ignore")
        import asyncssh
    return asyncssh


@dataclass(frozen=True, slots=True)
class SshTarget:
    host: str
    port: int = 22
    user: str | None = None
    identity: str | None = None  # a private key file; None: the user's agent and default keys
    known_hosts: str | None = None  # a known_hosts file; None: ~/.ssh/known_hosts; "none": no check
    python: str = "python3"  # the host's interpreter, with redis-py (and the design's library)

    @classmethod
    def parse(cls, text: str, **options: Any) -> SshTarget:
        m = TARGET.match(text)
        if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
            raise ValueError(f"{text!r} is not an SSH target: [user@]host[:port]")
        return cls(m["host"].strip("[]"), int(m["port"] or 22), m["user"], **options)

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"

    def options(self) -> dict[str, Any]:
        o: dict[str, Any] = {"port": self.port, "connect_timeout": CONNECT_TIMEOUT, "password": None}
        if self.user:
            o["username"] = self.user
        if self.identity:
            o["client_keys"] = [str(Path(self.identity).expanduser())]
            o["agent_path"] = None
        if self.known_hosts == "none":
            o["known_hosts"] = None
        elif self.known_hosts:
            o["known_hosts"] = str(Path(self.known_hosts).expanduser())
        return o


async def connect(target: SshTarget) -> Any:
    asyncssh = _asyncssh()
    try:
        return await asyncssh.connect(target.host, **target.options())
    except (TimeoutError, OSError, asyncssh.Error) as exc:
        raise SshError(f"cannot reach {target} over SSH: {exc or type(exc).__name__}") from None


def run(
    target: SshTarget, command: str, input: str | None = None, check: bool = True, put: Path | None = None, to: str = ""
) -> str:
    """One command on the host over a connection of its own (after copying `put` to `to` with SFTP, if
    given): its stdout; its failure (with `check`) an SshError naming its last line of stderr. Plain and
    thread-free, for the run's loop, which forks workers and never awaits."""

    async def go() -> Any:
        conn = await connect(target)
        async with conn:
            if put is not None:
                async with conn.start_sftp_client() as sftp:
                    await sftp.put(str(put), to)
            return await conn.run(command, input=input, check=False)

    done = asyncio.run(go())
    if check and done.exit_status != 0:
        last = (str(done.stderr or "").strip().splitlines() or [f"exit status {done.exit_status}"])[-1]
        raise SshError(f"{target}: {command.split()[0]} failed: {last}")
    return str(done.stdout or "")


def quote(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def package_zip(into: Path) -> Path:
    """crashbench's own package, every .py of it, as one zip a host's Python imports from (its
    PYTHONPATH): what a worker needs of crashbench, shipped; redis-py and the library are the host's."""
    package = Path(__file__).resolve().parent.parent
    path = into / "crashbench.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(package.rglob("*.py")):
            z.write(f, f.relative_to(package.parent).as_posix())
    return path
