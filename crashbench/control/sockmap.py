"""The fault proxy's kernel path (crashbench.control.proxy): with no toxic on, a connection's two sockets
forward to each other inside the kernel, through a BPF sockmap, and the proxy process is not woken
for each chunk. Root (CAP_BPF and CAP_NET_ADMIN) and a kernel with sockmaps, else `Sockmap.open()` is
None and every connection takes the process's own path, as before.

A BPF program (an sk_skb stream verdict, attached to the sockmap) runs for every chunk a socket in
the map receives: it looks the socket up by its cookie in `peers`, and if it is there, adds the
chunk's length to the socket's counter and redirects the chunk to its peer's send side; if it is not,
the chunk goes to the socket as usual (SK_PASS) and the proxy reads it. The proxy switches a
direction to its own path by deleting the source socket's entry: from then on every chunk comes to
the process, where the toxics apply. The kernel sends a redirected chunk from a work queue, a moment
later, so the proxy does not send anything on a socket, nor close it, before that socket has taken
all that its peer's counter says was redirected to it (`sent_total`): nothing overtakes, nothing is
lost. A direction never goes back to the kernel: a connection opened while a toxic is on, or once a
toxic was on it, stays on the process's path for its life.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import termios

_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
SO_COOKIE = 57
_MAP_CREATE, _MAP_LOOKUP, _MAP_UPDATE, _MAP_DELETE, _PROG_LOAD, _PROG_ATTACH = 0, 1, 2, 3, 5, 8
_HASH, _ARRAY, _SOCKMAP = 1, 2, 15
_SK_SKB = 14  # program type
_STREAM_VERDICT = 5  # attach type
_LOOKUP, _COOKIE, _REDIRECT_MAP = 1, 46, 52  # helpers
_SK_PASS = 1
_TCP_INFO_BYTES_ACKED = 120  # struct tcp_info's tcpi_bytes_acked (u64), Linux 4.1 on
_ALIVE = (1, 8)  # TCP_ESTABLISHED, TCP_CLOSE_WAIT: states in which a socket still sends


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _map_fd(dst: int, fd: int) -> bytes:  # ld_imm64 dst, map (BPF_PSEUDO_MAP_FD), two slots
    return _insn(0x18, dst, 1, 0, fd) + _insn(0, 0, 0, 0, 0)


def _program(peers: int, counts: int, socks: int) -> bytes:
    """peers: cookie (u64) -> (peer's index in socks, own index in counts) (u32, u32)."""
    return b"".join([
        _insn(0xBF, 6, 1),                  # r6 = ctx
        _insn(0x85, imm=_COOKIE),           # r0 = the socket's cookie
        _insn(0x7B, 10, 0, -8),             # *(u64 *)(fp - 8) = r0
        _map_fd(1, peers),
        _insn(0xBF, 2, 10), _insn(0x07, 2, imm=-8),
        _insn(0x85, imm=_LOOKUP),           # r0 = peers[cookie]
        _insn(0x15, 0, off=18, imm=0),      # not there: pass
        _insn(0x61, 7, 0, 0),               # r7 = peer index
        _insn(0x61, 8, 0, 4),               # r8 = own index
        _insn(0x63, 10, 8, -12),            # *(u32 *)(fp - 12) = r8
        _map_fd(1, counts),
        _insn(0xBF, 2, 10), _insn(0x07, 2, imm=-12),
        _insn(0x85, imm=_LOOKUP),           # r0 = &counts[own index]
        _insn(0x15, 0, off=9, imm=0),       # out of range (never): pass
        _insn(0x61, 1, 6, 0),               # r1 = skb->len
        _insn(0xDB, 0, 1, 0, 0),            # lock *(u64 *)(r0 + 0) += r1
        _insn(0xBF, 1, 6),                  # r1 = ctx
        _map_fd(2, socks),
        _insn(0xBF, 3, 7),                  # r3 = peer index
        _insn(0xB7, 4, imm=0),              # r4 = 0: to the peer's send side
        _insn(0x85, imm=_REDIRECT_MAP),
        _insn(0x95),                        # return its verdict
        _insn(0xB7, 0, imm=_SK_PASS),
        _insn(0x95),
    ])  # fmt: skip


class _Bpf:
    def __init__(self) -> None:
        if _SYS_BPF is None:
            raise OSError("no bpf system call known on this machine")
        self.libc = ctypes.CDLL(None, use_errno=True)

    def __call__(self, cmd: int, attr: bytes) -> int:
        buf = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
        fd = self.libc.syscall(_SYS_BPF, cmd, buf, 128)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(fd)

    def map(self, kind: int, key: int, value: int, entries: int) -> int:
        return self(_MAP_CREATE, struct.pack("<IIII", kind, key, value, entries))

    def elem(self, cmd: int, fd: int, key: bytes, value: ctypes.Array[ctypes.c_char] | None = None) -> None:
        k = ctypes.create_string_buffer(key, len(key))
        v = ctypes.addressof(value) if value is not None else 0
        self(cmd, struct.pack("<IIQQQ", fd, 0, ctypes.addressof(k), v, 0))


class Sockmap:
    """The maps and the program, one per proxy process; slots in `socks` and `counts` are handed out
    per socket and back when it closes."""

    def __init__(self, bpf: _Bpf, capacity: int) -> None:
        self.bpf, self.capacity = bpf, capacity
        self.fds: list[int] = []
        try:
            self.peers = self._keep(bpf.map(_HASH, 8, 8, capacity))
            self.counts = self._keep(bpf.map(_ARRAY, 4, 8, capacity))
            self.socks = self._keep(bpf.map(_SOCKMAP, 4, 4, capacity))
            code = _program(self.peers, self.counts, self.socks)
            license_ = ctypes.create_string_buffer(b"GPL")
            insns = ctypes.create_string_buffer(code, len(code))
            attr = struct.pack("<IIQQ", _SK_SKB, len(code) // 8, ctypes.addressof(insns), ctypes.addressof(license_))
            prog = self._keep(bpf(_PROG_LOAD, attr))
            bpf(_PROG_ATTACH, struct.pack("<IIII", self.socks, prog, _STREAM_VERDICT, 0))
        except OSError:
            self.close()
            raise
        self.free = list(range(capacity - 1, -1, -1))

    def _keep(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    @classmethod
    def open(cls, capacity: int = 4096) -> tuple[Sockmap | None, str]:
        """The kernel path, or None and why not (not root, no sockmaps, CRASHBENCH_PROXY_SOCKMAP=0)."""
        if os.environ.get("CRASHBENCH_PROXY_SOCKMAP", "1") == "0":
            return None, "CRASHBENCH_PROXY_SOCKMAP=0"
        try:
            return cls(_Bpf(), capacity), ""
        except OSError as exc:
            return None, f"no BPF sockmap here: {exc}"

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def pair(self, client: socket.socket, server: socket.socket) -> Pair | None:
        """Put a connection's two sockets in the map, each redirecting to the other, or None when the
        map is full or will not take them. Until both are in, neither socket's data-ready hook runs
        for what arrives (SO_RCVLOWAT as high as it goes): a chunk the program saw then would go to the
        process (no entry yet) or nowhere (no peer yet). Setting it back to 1 runs the hook, which
        sends on what came meanwhile, and what came before, in order."""
        socks = (client, server)
        try:
            cookies = (_cookie(client), _cookie(server))
        except OSError:
            return None
        if len(self.free) < 2:
            return None
        i, j = self.free.pop(), self.free.pop()
        try:
            for sock in socks:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1 << 30)  # capped by the kernel
            base = [sent_total(sock) for sock in socks]
            pair = Pair(self, cookies, socks, (i, j), base)
            for own, sock in ((i, client), (j, server)):
                self.bpf.elem(_MAP_UPDATE, self.counts, struct.pack("<I", own), _value(bytes(8)))
                self.bpf.elem(_MAP_UPDATE, self.socks, struct.pack("<I", own), _value(struct.pack("<I", sock.fileno())))
            for cookie, peer, own in ((cookies[0], j, i), (cookies[1], i, j)):
                self.bpf.elem(_MAP_UPDATE, self.peers, cookie, _value(struct.pack("<II", peer, own)))
        except OSError:
            for own in (i, j):
                with contextlib.suppress(OSError):
                    self.bpf.elem(_MAP_DELETE, self.socks, struct.pack("<I", own))
            for cookie in cookies:
                with contextlib.suppress(OSError):
                    self.bpf.elem(_MAP_DELETE, self.peers, cookie)
            self.free += [i, j]
            pair = None
        for sock in socks:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        return pair


class Pair:
    """A connection's sockets in the map. Per direction (0: client -> server, 1: server -> client): the
    source socket's cookie and slot, and what the destination had sent when it was put in the map."""

    def __init__(
        self, maps: Sockmap, cookies: tuple[bytes, bytes], socks: tuple[socket.socket, socket.socket],
        slots: tuple[int, int], base: list[int | None],
    ) -> None:  # fmt: skip
        if None in base:
            raise OSError("a socket that no longer sends")
        self.maps, self.cookies, self.socks, self.slots = maps, cookies, socks, slots
        self.base = (base[1] or 0, base[0] or 0)  # the destination's, per direction
        self.released = False

    def leave(self, direction: int) -> None:
        """The direction's chunks come to the process from now on (leaving twice is no error)."""
        with contextlib.suppress(OSError):
            self.maps.bpf.elem(_MAP_DELETE, self.maps.peers, self.cookies[direction])

    def redirected(self, direction: int) -> int:
        """Bytes the kernel took for the direction, so far."""
        out = _value(bytes(8))
        self.maps.bpf.elem(_MAP_LOOKUP, self.maps.counts, struct.pack("<I", self.slots[direction]), out)
        return int(struct.unpack("<Q", out.raw)[0])

    def flushed(self, direction: int) -> bool:
        """Whether the destination took every byte the kernel redirected to it (or sends no more), once
        the direction left the map: then the process may send on it, or close it."""
        total = sent_total(self.socks[1 - direction])
        return total is None or total - self.base[direction] >= self.redirected(direction)

    def release(self) -> None:
        """Both directions out, the slots back (a closed socket leaves `socks` by itself; a slot's next
        socket replaces one still closing, whose redirected bytes were flushed before it closed)."""
        if not self.released:
            self.released = True
            self.leave(0)
            self.leave(1)
            self.maps.free += self.slots


def _value(data: bytes) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(data, len(data))


def _cookie(sock: socket.socket) -> bytes:
    return sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8)


def sent_total(sock: socket.socket) -> int | None:
    """Every byte ever put on `sock`'s send side (acknowledged, plus still queued), or None once it
    sends no more (reset, or closed): what is owed to it then never arrives."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return None
    if info[0] not in _ALIVE:
        return None
    return int(struct.unpack_from("<Q", info, _TCP_INFO_BYTES_ACKED)[0]) + queued
