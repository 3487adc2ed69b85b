"""The network fault proxy's event loop (crashbench.control.proxy): epoll, a reader and a writer
callback per descriptor, timers, and tasks that are generators waiting by yielding seconds; and how
the proxy sets up and closes its sockets on it.

The proxy ran on asyncio's loop before. With no toxic on, all the proxy does per chunk is one read
and one send, and asyncio's machinery around each readiness event (a selector key, a Handle, the
ready queue, a context to run it in, the scheduled timers looked at twice) cost as much Python as
the chunk's own work. Here an event is a dictionary lookup and a call.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import select
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Generator
from typing import Any

Task = Generator[float, None, None]  # yields the seconds it waits for (asyncio.sleep's argument)
Callback = tuple[Callable[..., Any], tuple[Any, ...]]

_IN, _OUT, _HUP = select.EPOLLIN, select.EPOLLOUT, select.EPOLLRDHUP
RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST, not a FIN
_ERR = select.EPOLLERR | select.EPOLLHUP  # both callbacks run: their own read or send sees the error


class Loop:
    def __init__(self) -> None:
        self._ep = select.epoll()
        self._readers: dict[int, Callback] = {}
        self._writers: dict[int, Callback] = {}
        self._masks: dict[int, int] = {}  # what epoll watches per descriptor
        self._quiet: set[int] = set()  # readers woken by the peer's end (or an error) only: `quiet`
        self._timers: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()  # timers due at the same time run in the order they were set
        self.running = False

    def _watch(self, fd: int) -> None:
        reading = (_HUP if fd in self._quiet else _IN) if fd in self._readers else 0
        mask = reading | (_OUT if fd in self._writers else 0)
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        try:
            if not mask:
                del self._masks[fd]
                self._ep.unregister(fd)
                return
            self._masks[fd] = mask
            if old:
                self._ep.modify(fd, mask)
            else:
                self._ep.register(fd, mask)
        except OSError as exc:
            # A descriptor closed without being unwatched leaves epoll by itself: its number, reused, is new.
            if exc.errno == errno.ENOENT and mask:
                self._ep.register(fd, mask)
            elif exc.errno not in (errno.ENOENT, errno.EBADF):
                raise

    def add_reader(self, fd: int, callback: Callable[..., Any], *args: Any) -> None:
        self._readers[fd] = (callback, args)
        self._watch(fd)

    def remove_reader(self, fd: int) -> None:
        self._quiet.discard(fd)
        if self._readers.pop(fd, None) is not None:
            self._watch(fd)

    def quiet(self, fd: int, on: bool) -> None:
        """Whether fd's reader waits for the end of the connection (EPOLLRDHUP) or an error only, not
        for data: a socket the kernel forwards is woken for every chunk it redirects (the socket's
        data-ready hook runs), with nothing to read."""
        (self._quiet.add if on else self._quiet.discard)(fd)
        self._watch(fd)

    def add_writer(self, fd: int, callback: Callable[..., Any], *args: Any) -> None:
        self._writers[fd] = (callback, args)
        self._watch(fd)

    def remove_writer(self, fd: int) -> None:
        if self._writers.pop(fd, None) is not None:
            self._watch(fd)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        heapq.heappush(self._timers, (time.monotonic() + max(0.0, delay), next(self._order), callback, args))

    def spawn(self, task: Task, done: Callable[[], Any] = lambda: None) -> None:
        """Run `task` now, up to its first wait; `done` once it returned."""
        self._step(task, done)

    def _step(self, task: Task, done: Callable[[], Any]) -> None:
        try:
            delay = next(task)
        except StopIteration:
            done()
            return
        self.call_later(delay, self._step, task, done)

    def stop(self) -> None:
        self.running = False

    def run(self) -> None:
        """Until stop(). A callback that raises is reported on stderr and the loop goes on, as asyncio's."""
        self.running = True
        poll, readers, writers, timers = self._ep.poll, self._readers, self._writers, self._timers
        while self.running:
            timeout = max(0.0, timers[0][0] - time.monotonic()) if timers else -1.0
            for fd, events in poll(timeout, 64):  # not 1,023 slots allocated per call
                try:
                    if events & (_IN | _HUP | _ERR) and (r := readers.get(fd)) is not None:
                        r[0](*r[1])
                    if events & (_OUT | _ERR) and (w := writers.get(fd)) is not None:
                        w[0](*w[1])
                except Exception:  # one connection's bug must not end every slot's
                    traceback.print_exc(file=sys.stderr)
            if timers:
                now = time.monotonic()
                while timers and timers[0][0] <= now:
                    _, _, callback, args = heapq.heappop(timers)
                    try:
                        callback(*args)
                    except Exception:
                        traceback.print_exc(file=sys.stderr)


def tuned(sock: socket.socket) -> socket.socket:
    # Non-blocking for the loop; TCP_NODELAY (as asyncio's transports): the traffic is small requests and
    # answers, and Nagle's algorithm would hold each one back until the previous one is acknowledged.
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def shut_socket(loop: Loop, sock: socket.socket, rst: bool = False) -> None:
    # Off the selector first: a closed descriptor's number is soon another socket's.
    loop.remove_reader(sock.fileno())
    loop.remove_writer(sock.fileno())
    if rst:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
    sock.close()
