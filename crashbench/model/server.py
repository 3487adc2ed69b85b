"""The server a session runs on, as the records know it: its address (secret: it may carry a
password), what it is, and its shape (one server, or a cluster's primaries and replicas)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from crashbench.redact import redact_url


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str = dataclasses.field(repr=False)  # may carry a password: to connect only; show `shown_url`
    # "embedded" | "external" | "cluster" (an embedded cluster) | "external-cluster" | "sentinel" (an embedded
    # Sentinel topology) | "external-sentinel"
    mode: str
    binary: str | None
    name: str  # "redis" | "valkey" | ...
    version: str
    pid: int | None = None  # the embedded server's process, for its CPU and memory figures
    primaries: int = 0  # a cluster's primaries that serve slots, and its replicas in all; 0 for one server
    replicas: int = 0
    # Behind Sentinel: the URL the workers are given (redis+sentinel://, secret too: they find the primary
    # themselves) while `url` is the primary the sentinels named at the start, the harness's; else "".
    workers_url: str = dataclasses.field(default="", repr=False)
    sentinels: int = 0  # the sentinels of workers_url

    @property
    def shown_url(self) -> str:
        """The URL for messages and logs (the sentinels', behind Sentinel): its password masked."""
        return redact_url(self.workers_url or self.url)

    @property
    def external(self) -> bool:
        """A server crashbench did not start: only its own namespace's keys may be touched."""
        return self.mode.startswith("external")

    @property
    def cluster(self) -> bool:
        return self.primaries > 0
