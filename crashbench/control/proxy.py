"""The network fault proxy: a TCP proxy between each worker slot and the server, with Toxiproxy's
toxics, so one worker (or all) can meet a slow, stalled, reset or refused connection. No root needed.

It runs as its own process (`python -m crashbench.control.proxy HOST:PORT ...`, one slot per target;
crashbench.control.proxyctl starts it), not as a thread of crashbench: workers are forked from
crashbench, and a fork must not copy a running event loop. It prints `READY <port> <port> ...` (one
listening port per slot, on 127.0.0.1) and then reads one JSON command per line on stdin, answering
`ok` (or `error: ...`) on stdout:

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
    down         peers (optional)        new connections are refused and open ones reset; with
                                         `peers` (source addresses), only those from them, reset
                                         as soon as accepted: a cut between hosts, one side each
                                         bound to an address of its own (a Redis Cluster's nodes)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import sys
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

TOXICS = ("latency", "bandwidth", "slicer", "limit_data", "timeout", "reset_peer", "down")
DIRECTIONS = ("upstream", "downstream", "both")

# Every socket is read into this one buffer: a chunk is sent on, or what a socket did not take copied,
# before the next read, so nothing holds on to it. asyncio's transports, which the proxy used before,
# allocate a fresh 256 KiB per read, which glibc serves with mmap, mremap and munmap: three system calls
# per chunk, half the proxy's CPU with no toxic on. The same size, so a toxic meets the same chunks.
_buffer = bytearray(256 * 1024)
_view = memoryview(_buffer)
RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST, not a FIN


@dataclass
class Slot:
    target: tuple[str, int]
    port: int = 0
    toxics: list[dict[str, Any]] = field(default_factory=list)
    conns: set[Conn] = field(default_factory=set)
    listener: socket.socket | None = None
    slow: frozenset[str] = frozenset()  # directions with a toxic on: their chunks go through the queue
    addresses: list[tuple[Any, ...]] = field(default_factory=list)  # the target's, resolved at the first connection

    def active(self, name: str, direction: str) -> dict[str, Any] | None:
        for t in self.toxics:
            if t["name"] == name and t.get("direction", "both") in (direction, "both"):
                return t
        return None

    def refuses(self, peer: str) -> bool:
        """A down toxic covers connections from `peer`: with no `peers`, every one."""
        t = self.active("down", "both")
        return t is not None and ("peers" not in t or peer in t["peers"])

    def down_all(self) -> bool:
        return (t := self.active("down", "both")) is not None and "peers" not in t

    def reset_after(self, peer: str) -> float | None:
        """Seconds after which a connection from `peer` is reset under the toxics on now, or None: at
        once when down, reset_peer's timeout, a timeout toxic's own when it has one (0 holds it open)."""
        if self.refuses(peer):
            return 0.0
        if (t := self.active("reset_peer", "both")) is not None:
            return t.get("timeout", 0) / 1000
        if (t := self.active("timeout", "both")) is not None and t.get("timeout", 0) > 0:
            return t["timeout"] / 1000
        return None


def _tuned(sock: socket.socket) -> socket.socket:
    # Non-blocking for the loop; TCP_NODELAY (as asyncio's transports): the traffic is small requests and
    # answers, and Nagle's algorithm would hold each one back until the previous one is acknowledged.
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Conn:
    """A worker's connection through the proxy: its client socket and the server socket, read with the
    loop's reader callbacks. Without a toxic on a direction a chunk is sent on as soon as it is read (no
    task, no copy); with one, it is copied into a queue that a task works off applying the toxics, in
    order. What a socket does not take at once waits in `unsent`, and the other socket is not read
    meanwhile: a slow reader holds the sender back, as TCP would. The server socket is None until
    it is connected; the client's is not read until then."""

    def __init__(self, slot: Slot, client: socket.socket, peer: str) -> None:
        self.slot, self.client, self.peer, self.loop = slot, client, peer, asyncio.get_running_loop()
        self.src: dict[str, socket.socket | None] = {"upstream": client, "downstream": None}
        self.dst: dict[str, socket.socket | None] = {"upstream": None, "downstream": client}
        self.unsent = {"upstream": bytearray(), "downstream": bytearray()}
        self.queues: dict[str, deque[bytes]] = {"upstream": deque(), "downstream": deque()}
        self.draining: set[str] = set()
        self.sent = {"upstream": 0, "downstream": 0}  # bytes, per direction (limit_data)
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()  # referenced until done

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def start(self, server: socket.socket) -> None:
        self.src["downstream"] = self.dst["upstream"] = server
        self.loop.add_reader(self.client.fileno(), self.readable, "upstream")
        self.loop.add_reader(server.fileno(), self.readable, "downstream")

    def readable(self, direction: str) -> None:
        sock = self.src[direction]
        assert sock is not None
        try:
            n = sock.recv_into(_buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0  # reset by its peer: the connection ends, as on an end of file
        if not n:
            self.close()
        elif direction in self.slot.slow or direction in self.draining:
            self.queues[direction].append(bytes(_view[:n]))
            if direction not in self.draining:
                self.draining.add(direction)
                self.spawn(self.drain(direction))
        else:
            self.sent[direction] += n
            self.write(direction, _view[:n])

    def write(self, direction: str, data: bytes | memoryview) -> None:
        out, unsent = self.dst[direction], self.unsent[direction]
        if self.closed or out is None or not data:
            return
        if not unsent:
            try:
                n = out.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self.close()
                return
            if n == len(data):
                return
            data = data[n:]
            self.loop.add_writer(out.fileno(), self.writable, direction)
            if (src := self.src[direction]) is not None:
                self.loop.remove_reader(src.fileno())
        unsent += data

    def writable(self, direction: str) -> None:
        out, unsent = self.dst[direction], self.unsent[direction]
        assert out is not None
        try:
            del unsent[: out.send(unsent)]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # its peer is gone, and so is the connection
            unsent.clear()
            self.close()
        if unsent or out.fileno() < 0:
            return
        self.loop.remove_writer(out.fileno())
        if self.closed:
            _shut(self.loop, out)  # flushed: now it can close
        elif (src := self.src[direction]) is not None:
            self.loop.add_reader(src.fileno(), self.readable, direction)

    async def drain(self, direction: str) -> None:
        slot, queue = self.slot, self.queues[direction]
        try:
            while queue and not self.closed:
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
                    self.write(direction, data[: max(0, t["bytes"] - sent)])
                    self.reset()
                    return
                self.sent[direction] = sent + len(data)
                if (t := slot.active("slicer", direction)) is not None:
                    size, variation = max(1, t.get("average_size", 64)), t.get("size_variation", 0)
                    while data and not self.closed:
                        n = max(1, size + random.randint(-variation, variation))
                        self.write(direction, data[:n])
                        data = data[n:]
                        await asyncio.sleep(t.get("delay", 0) / 1e6)
                else:
                    self.write(direction, data)
        finally:
            self.draining.discard(direction)

    def close(self) -> None:
        """Close both sides with a FIN, each once what it had to send went; what a toxic held is dropped."""
        if self.closed:
            return
        self.closed = True
        self.slot.conns.discard(self)
        for direction, sock in self.dst.items():
            if sock is not None and sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
                if not self.unsent[direction]:  # else writable() closes it once flushed
                    _shut(self.loop, sock)

    def reset(self) -> None:
        """Close both sides with an RST, as a peer that vanished would."""
        self.closed = True
        self.slot.conns.discard(self)
        for sock in self.dst.values():
            if sock is not None and sock.fileno() >= 0:
                _shut(self.loop, sock, rst=True)


def _shut(loop: asyncio.AbstractEventLoop, sock: socket.socket, rst: bool = False) -> None:
    # Off the selector first: a closed descriptor's number is soon another socket's.
    loop.remove_reader(sock.fileno())
    loop.remove_writer(sock.fileno())
    if rst:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
    sock.close()


class Proxy:
    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.slots = [Slot(target) for target in targets]

    def listen(self, slot: Slot) -> None:
        sock = socket.create_server(("127.0.0.1", slot.port), backlog=100)  # SO_REUSEADDR: the same port after down
        sock.setblocking(False)
        slot.port, slot.listener = sock.getsockname()[1], sock
        self.rearm(slot, sock)

    def rearm(self, slot: Slot, listener: socket.socket) -> None:
        if slot.listener is listener:  # not closed (down) meanwhile
            asyncio.get_running_loop().add_reader(listener.fileno(), self.accept, slot, listener)

    def accept(self, slot: Slot, listener: socket.socket) -> None:
        for _ in range(100):
            try:
                client, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: retry in a while, not in a busy loop (as asyncio)
                asyncio.get_running_loop().remove_reader(listener.fileno())
                asyncio.get_running_loop().call_later(1.0, self.rearm, slot, listener)
                return
            conn = Conn(slot, _tuned(client), peer[0])
            if slot.refuses(conn.peer):
                conn.reset()
                continue
            slot.conns.add(conn)
            conn.spawn(self.connect(conn))

    async def connect(self, conn: Conn) -> None:
        loop, slot = asyncio.get_running_loop(), conn.slot
        try:
            if not slot.addresses:
                slot.addresses = await loop.getaddrinfo(*slot.target, type=socket.SOCK_STREAM)
        except OSError:
            conn.reset()
            return
        for family, kind, proto, _, address in slot.addresses:
            server = _tuned(socket.socket(family, kind, proto))
            try:
                await loop.sock_connect(server, address)
            except OSError:
                server.close()
                continue
            if conn.closed:  # reset while it connected (the slot went down)
                server.close()
                return
            conn.start(server)
            if (after := slot.reset_after(conn.peer)) is not None:
                loop.call_later(after, conn.reset)
            return
        conn.reset()

    async def set(self, slots: list[int], toxics: list[dict[str, Any]]) -> None:
        for t in toxics:
            if t.get("name") not in TOXICS or t.get("direction", "both") not in DIRECTIONS:
                raise ValueError(f"unknown toxic {t.get('name')!r} or direction {t.get('direction')!r}")
            if "peers" in t and not (isinstance(t["peers"], list) and all(isinstance(a, str) for a in t["peers"])):
                raise ValueError(f"peers must be a list of addresses, not {t['peers']!r}")
        for i in slots:
            slot = self.slots[i]
            was_down = slot.down_all()
            slot.toxics = list(toxics)
            on = {t.get("direction", "both") for t in toxics}
            slot.slow = frozenset(d for d in ("upstream", "downstream") if on & {d, "both"})
            down = slot.down_all()
            if down and not was_down and slot.listener is not None:
                _shut(asyncio.get_running_loop(), slot.listener)  # connections not yet accepted get an RST
                slot.listener = None
            for conn in list(slot.conns):
                if (after := slot.reset_after(conn.peer)) is not None:
                    asyncio.get_running_loop().call_later(after, conn.reset)
            if was_down and not down:
                self.listen(slot)  # the same port again

    async def serve(self) -> None:
        for slot in self.slots:
            self.listen(slot)
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


def main(argv: list[str]) -> int:
    from crashbench.control.reaper import die_with_parent

    die_with_parent()
    targets = [(host, int(port)) for host, _, port in (a.rpartition(":") for a in argv)]
    asyncio.run(Proxy(targets).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
