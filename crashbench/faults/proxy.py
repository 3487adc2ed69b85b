"""The network fault proxy: a TCP proxy between each worker slot and the server, with Toxiproxy's
toxics, so one worker (or all) can meet a slow, stalled, reset or refused connection. No root needed.

It runs as its own process (`python -m crashbench.faults.proxy HOST PORT SLOTS`), not as a thread of
crashbench: workers are forked from crashbench, and a fork must not copy a running event loop. It
prints `READY <port> <port> ...` (one listening port per slot, on 127.0.0.1) and then reads one JSON
command per line on stdin, answering `ok` (or `error: ...`) on stdout:

    {"slots": [0, 2], "toxics": [{"name": "latency", "direction": "both", "latency": 200, "jitter": 50}]}

sets the toxics of those slots (an empty list heals them). It exits when stdin closes, so it never
outlives crashbench (and it asks the kernel to kill it when its parent dies).

Toxics, with Toxiproxy's names and attributes (times in ms), each `upstream` (worker -> server),
`downstream` (server -> worker) or `both`:

    latency      latency, jitter         each chunk waits latency +- jitter
    bandwidth    rate (KB/s)             each chunk waits as long as the rate needs
    slicer       average_size, size_variation (bytes), delay (us)   chunks cut small, a delay apart
    limit_data   bytes                   the connection is closed once that many bytes went through
    timeout      timeout                 nothing goes through (a half-open connection: both sockets
                                         stay open); closed after `timeout` ms, never if 0
    reset_peer   timeout                 connections are reset (RST: SO_LINGER 0) after `timeout` ms
    down         (none)                  new connections are refused and open ones reset
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import select
import socket
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from crashbench.errors import RunAborted, UsageError

TOXICS = ("latency", "bandwidth", "slicer", "limit_data", "timeout", "reset_peer", "down")
DIRECTIONS = ("upstream", "downstream", "both")


@dataclass
class Slot:
    port: int = 0
    toxics: list[dict[str, Any]] = field(default_factory=list)
    conns: set[Conn] = field(default_factory=set)
    server: asyncio.Server | None = None

    def active(self, name: str, direction: str) -> dict[str, Any] | None:
        for t in self.toxics:
            if t["name"] == name and t.get("direction", "both") in (direction, "both"):
                return t
        return None

    def reset_after(self) -> float | None:
        """Seconds after which a connection is reset under the toxics on now, or None: at once when
        down, reset_peer's timeout, a timeout toxic's own when it has one (0 holds it open)."""
        if self.active("down", "both") is not None:
            return 0.0
        if (t := self.active("reset_peer", "both")) is not None:
            return t.get("timeout", 0) / 1000
        if (t := self.active("timeout", "both")) is not None and t.get("timeout", 0) > 0:
            return t["timeout"] / 1000
        return None

    def any_active(self, direction: str) -> bool:
        return any(t.get("direction", "both") in (direction, "both") for t in self.toxics)


class Side(asyncio.Protocol):
    """One socket of a proxied connection: what it receives goes to the other side, in `direction`."""

    def __init__(self, conn: Conn, direction: str) -> None:
        self.conn, self.direction = conn, direction
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.forward(self.direction, data)

    def eof_received(self) -> bool:
        self.conn.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.close()

    # A slow reader on the other side holds this side's reading back, as TCP would.
    def pause_writing(self) -> None:
        if (t := self.conn.other(self)) is not None:
            t.pause_reading()

    def resume_writing(self) -> None:
        if (t := self.conn.other(self)) is not None:
            t.resume_reading()


class Conn:
    """A worker's connection through the proxy: its client side and the server side. Without a toxic
    on a direction, data goes straight through (no task, no copy); with one, through a queue that a
    task works off applying the toxics, in order."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.client = Side(self, "upstream")  # receives from the worker
        self.server = Side(self, "downstream")  # receives from the server
        self.queues: dict[str, deque[bytes]] = {"upstream": deque(), "downstream": deque()}
        self.draining: set[str] = set()
        self.sent = {"upstream": 0, "downstream": 0}  # bytes, per direction (limit_data)
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()  # referenced until done

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def other(self, side: Side) -> asyncio.Transport | None:
        return (self.server if side is self.client else self.client).transport

    def target(self, direction: str) -> asyncio.Transport | None:
        return (self.server if direction == "upstream" else self.client).transport

    def forward(self, direction: str, data: bytes) -> None:
        out = self.target(direction)
        if out is not None and not self.slot.any_active(direction) and direction not in self.draining:
            self.sent[direction] += len(data)
            out.write(data)
            return
        self.queues[direction].append(data)
        if direction not in self.draining:
            self.draining.add(direction)
            self.spawn(self.drain(direction))

    async def drain(self, direction: str) -> None:
        slot, queue = self.slot, self.queues[direction]
        try:
            while queue and not self.closed:
                out = self.target(direction)
                if out is None:  # the server side is still connecting
                    await asyncio.sleep(0.001)
                    continue
                data = queue.popleft()
                if slot.active("timeout", direction) is not None:
                    continue  # swallowed: the peer waits for an answer that never comes
                if (t := slot.active("latency", direction)) is not None:
                    jitter = t.get("jitter", 0)
                    await asyncio.sleep(max(0.0, t.get("latency", 0) + random.uniform(-jitter, jitter)) / 1000)
                if (t := slot.active("bandwidth", direction)) is not None and t.get("rate", 0) > 0:
                    await asyncio.sleep(len(data) / (t["rate"] * 1024))
                sent = self.sent[direction]
                if (t := slot.active("limit_data", direction)) is not None and sent + len(data) > t["bytes"]:
                    out.write(data[: max(0, t["bytes"] - sent)])
                    self.reset()
                    return
                self.sent[direction] = sent + len(data)
                if (t := slot.active("slicer", direction)) is not None:
                    size, variation = max(1, t.get("average_size", 64)), t.get("size_variation", 0)
                    while data and not self.closed:
                        n = max(1, size + random.randint(-variation, variation))
                        out.write(data[:n])
                        data = data[n:]
                        await asyncio.sleep(t.get("delay", 0) / 1e6)
                else:
                    out.write(data)
        finally:
            self.draining.discard(direction)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.slot.conns.discard(self)
        for side in (self.client, self.server):
            if side.transport is not None:
                side.transport.close()

    def reset(self) -> None:
        """Close both sides with an RST, as a peer that vanished would."""
        self.closed = True
        self.slot.conns.discard(self)
        for side in (self.client, self.server):
            t = side.transport
            if t is None:
                continue
            sock = t.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            t.abort()


class Proxy:
    def __init__(self, host: str, port: int, slots: int) -> None:
        self.host, self.port = host, port
        self.slots = [Slot() for _ in range(slots)]

    async def listen(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        slot.server = await loop.create_server(lambda: self.accept(slot), "127.0.0.1", slot.port, reuse_address=True)
        slot.port = slot.server.sockets[0].getsockname()[1]

    def accept(self, slot: Slot) -> Side:
        conn = Conn(slot)
        slot.conns.add(conn)
        loop = asyncio.get_running_loop()

        async def connect() -> None:
            try:
                await loop.create_connection(lambda: conn.server, self.host, self.port)
            except OSError:
                conn.reset()
                return
            if (after := slot.reset_after()) is not None:
                loop.call_later(after, conn.reset)

        conn.spawn(connect())
        return conn.client

    async def set(self, slots: list[int], toxics: list[dict[str, Any]]) -> None:
        for t in toxics:
            if t.get("name") not in TOXICS or t.get("direction", "both") not in DIRECTIONS:
                raise ValueError(f"unknown toxic {t.get('name')!r} or direction {t.get('direction')!r}")
        for i in slots:
            slot = self.slots[i]
            was_down = slot.active("down", "both") is not None
            slot.toxics = list(toxics)
            down = slot.active("down", "both") is not None
            if down and not was_down and slot.server is not None:
                slot.server.close()
                slot.server = None
            if (after := slot.reset_after()) is not None:
                for conn in list(slot.conns):
                    asyncio.get_running_loop().call_later(after, conn.reset)
            if was_down and not down:
                await self.listen(slot)  # the same port again

    async def serve(self) -> None:
        for slot in self.slots:
            await self.listen(slot)
        print("READY " + " ".join(str(s.port) for s in self.slots), flush=True)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            try:
                cmd = json.loads(line)
                await self.set(list(cmd["slots"]), list(cmd["toxics"]))
                print("ok", flush=True)
            except (ValueError, KeyError, TypeError, IndexError, OSError) as exc:
                print(f"error: {exc}", flush=True)


class ProxyProcess:
    """crashbench's side: the proxy process for one run, its ports, and the toxics it is told."""

    STARTUP_TIMEOUT = 10.0

    def __init__(self, host: str, port: int, slots: int, log: Path) -> None:
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "crashbench.faults.proxy", host, str(port), str(slots)],
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
    """The proxy for a run's workers, in front of the server at `redis_url`."""
    parts = urlsplit(redis_url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise UsageError(f"network faults need a TCP server URL (redis://host:port), not a {parts.scheme} one")
    return ProxyProcess(parts.hostname, parts.port or 6379, slots, log)


def main(argv: list[str]) -> int:
    from crashbench.run.reaper import die_with_parent

    die_with_parent()
    host, port, slots = argv[0], int(argv[1]), int(argv[2])
    asyncio.run(Proxy(host, port, slots).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
