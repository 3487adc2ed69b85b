"""The network fault proxy: a TCP proxy between each worker slot and the server, with Toxiproxy's
toxics, so one worker (or all) can meet a slow, stalled, reset or refused connection. No root needed;
as root, a connection opened while its slot has no toxic on is forwarded by the kernel (a BPF sockmap,
crashbench.control.sockmap) until a toxic comes on, and the proxy is not woken for each chunk.

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

import errno
import json
import os
import random
import socket
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from crashbench.control.proxyloop import Loop, Task, shut_socket, tuned
from crashbench.control.sockmap import Pair, Sockmap

WAYS = {"upstream": 0, "downstream": 1}  # a direction's number in crashbench.control.sockmap
TOXICS = ("latency", "bandwidth", "slicer", "limit_data", "timeout", "reset_peer", "down")
DIRECTIONS = ("upstream", "downstream", "both")

# Every socket is read into this one buffer: a chunk is sent on, or what a socket did not take copied,
# before the next read, so nothing holds on to it. asyncio's transports, which the proxy used before,
# allocate a fresh 256 KiB per read, which glibc serves with mmap, mremap and munmap: three system calls
# per chunk, half the proxy's CPU with no toxic on. The same size, so a toxic meets the same chunks.
_buffer = bytearray(256 * 1024)
_view = memoryview(_buffer)


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


class Conn:
    """A worker's connection through the proxy: its client socket and the server socket, read with the
    loop's reader callbacks. Without a toxic on a direction a chunk is sent on as soon as it is read (no
    task, no copy); with one, it is copied into a queue that a task works off applying the toxics, in
    order. What a socket does not take at once waits in `unsent`, and the other socket is not read
    meanwhile: a slow reader holds the sender back, as TCP would. The server socket is None until
    it is connected; the client's is not read until then. A connection the kernel forwards (`pair`)
    comes here only at its end, or once a toxic took a direction out of the kernel's map."""

    def __init__(self, loop: Loop, slot: Slot, client: socket.socket, peer: str) -> None:
        self.slot, self.client, self.peer, self.loop = slot, client, peer, loop
        self.src: dict[str, socket.socket | None] = {"upstream": client, "downstream": None}
        self.dst: dict[str, socket.socket | None] = {"upstream": None, "downstream": client}
        self.unsent = {"upstream": bytearray(), "downstream": bytearray()}
        self.queues: dict[str, deque[bytes]] = {"upstream": deque(), "downstream": deque()}
        self.draining: set[str] = set()
        self.sent = {"upstream": 0, "downstream": 0}  # bytes, per direction (limit_data)
        self.closed = False
        self.pair: Pair | None = None  # its sockets in the kernel's sockmap, forwarding to each other
        self.pending: set[str] = set()  # directions the kernel forwarded, not known to be all delivered

    def start(self, server: socket.socket, maps: Sockmap | None) -> None:
        """With `maps` (no toxic on its slot), the kernel forwards the connection's chunks; the readers
        then only see its end, or what comes once a toxic took a direction out of the map."""
        self.src["downstream"] = self.dst["upstream"] = server
        if maps is not None and (pair := maps.pair(self.client, server)) is not None:
            self.pair, self.pending = pair, {"upstream", "downstream"}
        for direction, sock in self.src.items():
            assert sock is not None
            self.loop.add_reader(sock.fileno(), self.readable, direction)
            self.loop.quiet(sock.fileno(), self.pair is not None)

    def leave(self, direction: str) -> None:
        """The direction's chunks come to the process from now on, for good."""
        if self.pair is not None and (src := self.src[direction]) is not None and src.fileno() >= 0:
            self.pair.leave(WAYS[direction])
            self.loop.quiet(src.fileno(), False)

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
        elif direction in self.slot.slow or direction in self.draining or direction in self.pending:
            self.queues[direction].append(bytes(_view[:n]))
            if direction not in self.draining:
                self.draining.add(direction)
                self.loop.spawn(self.drain(direction))
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
            shut_socket(self.loop, out)  # flushed: now it can close
        elif (src := self.src[direction]) is not None:
            self.loop.add_reader(src.fileno(), self.readable, direction)

    def drain(self, direction: str) -> Task:
        slot, queue = self.slot, self.queues[direction]
        try:
            yield from self.flush(direction)
            while queue and not self.closed:
                data = queue.popleft()
                if slot.active("timeout", direction) is not None:
                    continue  # swallowed: the peer waits for an answer that never comes
                if (t := slot.active("latency", direction)) is not None:
                    jitter = t.get("jitter", 0)
                    yield max(0.0, t.get("latency", 0) + random.uniform(-jitter, jitter)) / 1000
                if (t := slot.active("bandwidth", direction)) is not None and t.get("rate", 0) > 0:
                    yield len(data) / (t["rate"] * 1024)
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
                        yield t.get("delay", 0) / 1e6
                else:
                    self.write(direction, data)
        finally:
            self.draining.discard(direction)

    def flush(self, direction: str) -> Task:
        """Take the direction out of the kernel's map, and wait until what the kernel forwarded reached
        its destination: only then may the process send on it, or close it."""
        if direction not in self.pending or self.pair is None:
            return
        self.leave(direction)
        wait = 0.0005
        while not self.pair.flushed(WAYS[direction]):
            yield wait
            wait = min(2 * wait, 0.05)
        if direction in self.pending:
            self.pending.discard(direction)
            self.sent[direction] += self.pair.redirected(WAYS[direction])

    def close(self) -> None:
        """Close both sides with a FIN, each once what it had to send went; what a toxic held is dropped."""
        if self.closed:
            return
        self.closed = True
        self.slot.conns.discard(self)
        for sock in self.dst.values():
            if sock is not None and sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
        self.loop.spawn(self.shut())

    def shut(self) -> Task:
        for direction in self.pending:  # both directions out of the map at once: what comes now is dropped
            self.leave(direction)
        for direction in list(self.pending):
            yield from self.flush(direction)
        if self.pair is not None:
            self.pair.release()
        for direction, sock in self.dst.items():
            if sock is not None and sock.fileno() >= 0 and not self.unsent[direction]:
                shut_socket(self.loop, sock)  # else writable() closes it once flushed

    def reset(self) -> None:
        """Close both sides with an RST, as a peer that vanished would."""
        self.closed = True
        self.slot.conns.discard(self)
        for sock in self.dst.values():
            if sock is not None and sock.fileno() >= 0:
                shut_socket(self.loop, sock, rst=True)
        if self.pair is not None:
            self.pair.release()


class Proxy:
    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.slots = [Slot(target) for target in targets]
        self.loop = Loop()
        self.commands = bytearray()  # what came on stdin up to its last full line
        self.maps: Sockmap | None = None  # the kernel's forwarding, where it can be had

    def listen(self, slot: Slot) -> None:
        sock = socket.create_server(("127.0.0.1", slot.port), backlog=100)  # SO_REUSEADDR: the same port after down
        sock.setblocking(False)
        slot.port, slot.listener = sock.getsockname()[1], sock
        self.rearm(slot, sock)

    def rearm(self, slot: Slot, listener: socket.socket) -> None:
        if slot.listener is listener:  # not closed (down) meanwhile
            self.loop.add_reader(listener.fileno(), self.accept, slot, listener)

    def accept(self, slot: Slot, listener: socket.socket) -> None:
        for _ in range(100):
            try:
                client, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: retry in a while, not in a busy loop (as asyncio)
                self.loop.remove_reader(listener.fileno())
                self.loop.call_later(1.0, self.rearm, slot, listener)
                return
            conn = Conn(self.loop, slot, tuned(client), peer[0])
            if slot.refuses(conn.peer):
                conn.reset()
                continue
            slot.conns.add(conn)
            self.connect(conn)

    def connect(self, conn: Conn) -> None:
        slot = conn.slot
        if not slot.addresses:
            try:  # a blocking lookup, once per slot: the targets are addresses, or names in /etc/hosts
                slot.addresses = socket.getaddrinfo(*slot.target, type=socket.SOCK_STREAM)
            except OSError:
                conn.reset()
                return
        self.dial(conn, 0)

    def dial(self, conn: Conn, i: int) -> None:
        """Connect to the target's i-th address, or the next one's if it fails; reset when none is left."""
        if i >= len(conn.slot.addresses):
            conn.reset()
            return
        family, kind, proto, _, address = conn.slot.addresses[i]
        server = tuned(socket.socket(family, kind, proto))
        error = server.connect_ex(address)
        if error == errno.EINPROGRESS:
            self.loop.add_writer(server.fileno(), self.connected, conn, i, server)
        elif error:
            server.close()
            self.dial(conn, i + 1)
        else:
            self.connected(conn, i, server)

    def connected(self, conn: Conn, i: int, server: socket.socket) -> None:
        self.loop.remove_writer(server.fileno())
        if conn.closed:  # reset while it connected (the slot went down)
            server.close()
        elif server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            server.close()
            self.dial(conn, i + 1)
        else:
            conn.start(server, self.maps if not conn.slot.toxics else None)
            if (after := conn.slot.reset_after(conn.peer)) is not None:
                self.loop.call_later(after, conn.reset)

    def set(self, slots: list[int], toxics: list[dict[str, Any]]) -> None:
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
                shut_socket(self.loop, slot.listener)  # connections not yet accepted get an RST
                slot.listener = None
            for conn in list(slot.conns):
                for direction in slot.slow & conn.pending:  # out of the kernel's map, for good
                    conn.leave(direction)
                if (after := slot.reset_after(conn.peer)) is not None:
                    self.loop.call_later(after, conn.reset)
            if was_down and not down:
                self.listen(slot)  # the same port again

    def serve(self) -> None:
        self.maps, why = Sockmap.open()
        print(f"kernel forwarding: {'on (BPF sockmap)' if self.maps else f'off ({why})'}", file=sys.stderr, flush=True)
        for slot in self.slots:
            self.listen(slot)
        print("READY " + " ".join(str(s.port) for s in self.slots), flush=True)
        self.loop.add_reader(sys.stdin.fileno(), self.command)
        self.loop.run()

    def command(self) -> None:
        """What came on stdin: each full line a command, answered; the end of stdin ends the proxy."""
        data = os.read(sys.stdin.fileno(), 65536)
        if not data:
            self.loop.stop()
            return
        self.commands += data
        while (end := self.commands.find(b"\n")) >= 0:
            line = bytes(self.commands[: end + 1])
            del self.commands[: end + 1]
            try:
                cmd = json.loads(line)
                self.set(list(cmd["slots"]), list(cmd["toxics"]))
                print("ok", flush=True)
            except (ValueError, KeyError, TypeError, IndexError, OSError) as exc:
                print(f"error: {exc}", flush=True)


def main(argv: list[str]) -> int:
    from crashbench.control.reaper import die_with_parent

    die_with_parent()
    targets = [(host, int(port)) for host, _, port in (a.rpartition(":") for a in argv)]
    Proxy(targets).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
