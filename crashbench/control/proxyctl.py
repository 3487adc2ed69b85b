"""crashbench's side of the network fault proxy (crashbench.control.proxy, a process of its own): start
it in front of one or more targets, read its ports, tell it the toxics, close it."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from crashbench.errors import RunAborted, UsageError


class ProxyProcess:
    """The proxy process, one slot per target: a slot listens on a port of its own on 127.0.0.1 and
    forwards every connection to its target (host, port)."""

    STARTUP_TIMEOUT = 10.0

    def __init__(self, targets: list[tuple[str, int]], log: Path) -> None:
        to = [f"{host}:{port}" for host, port in targets]
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "crashbench.control.proxy", *to],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
            )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self._line(self.STARTUP_TIMEOUT)
        if not line.startswith("READY "):
            self.close()
            raise RunAborted(f"the network fault proxy did not start: {line or 'no answer'} (its log: {log})")
        self.ports = [int(p) for p in line.split()[1:]]

    def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else ""

    def set(self, slots: list[int], toxics: list[dict[str, Any]]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"slots": slots, "toxics": toxics}) + "\n")
        self.proc.stdin.flush()
        answer = self._line(5.0)
        if answer != "ok":
            raise RunAborted(f"the network fault proxy refused {toxics} on slots {slots}: {answer or 'no answer'}")

    def url(self, url: str, slot: int) -> str:
        """`url` with its host and port replaced by the slot's listening port (the password kept)."""
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")
        host = f"127.0.0.1:{self.ports[slot]}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if netloc[1] else host))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the proxy exits when its stdin closes
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def proxy_for(redis_url: str, slots: int, log: Path) -> ProxyProcess:
    """The proxy for a run's workers: `slots` ports in front of the server at `redis_url`."""
    parts = urlsplit(redis_url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise UsageError(f"network faults need a TCP server URL (redis://host:port), not a {parts.scheme} one")
    return ProxyProcess([(parts.hostname, parts.port or 6379)] * slots, log)
