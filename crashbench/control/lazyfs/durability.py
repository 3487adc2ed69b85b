"""What is durable on the lazy file system: each file's length at its last fsync (or as the kernel's
writeback has it), and the power cut that forgets the rest (crashbench.control.lazyfs)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

PAGE = 4096
WRITEBACK_GRAIN = 0.01  # of the writeback: the writes of one such slice share an entry of a file's history


class Durability:
    """The durable length of each file (paths relative to the root, "/a/b"), and the cut; thread-safe.

    With `writeback` (seconds), the kernel's writeback of dirty pages as well: a file's bytes written at
    time t are durable from t + writeback on, fsynced or not. Each file keeps the (time, length) of its
    writes since its last durable point (`wrote`), one entry per WRITEBACK_GRAIN of the writeback (its
    latest write's time and the length after it: never durable early, at most a grain late), and each
    entry older than the writeback is folded into the durable length (so a file keeps at most about
    1 / WRITEBACK_GRAIN entries). `now` is the clock (time.monotonic; a test passes its own)."""

    def __init__(self, root: Path, writeback: float | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.root, self.writeback, self.now = root, writeback, now
        self.grain = (writeback or 0) * WRITEBACK_GRAIN
        self.lock = threading.Lock()
        self.durable: dict[str, int] = {}
        self.history: dict[str, deque[tuple[float, int]]] = {}  # path -> (time, length) since durable
        # each file's last fsync: CLOCK_MONOTONIC (one clock for the whole machine) just before and just after
        # its length was read. A write acknowledged before the first is in that length; one begun after the
        # second is not (crashbench.faults.power.cut checks the server's bytes against them)
        self.synced_at: dict[str, tuple[float, float]] = {}
        self.last_cut: dict[str, dict[str, object]] = {}  # the last cut's account of every file (`cut`)
        for path in root.rglob("*"):
            if path.is_file():
                self.durable["/" + str(path.relative_to(root))] = path.stat().st_size

    def _fold(self, path: str, at: float) -> None:
        """Every write of `path` made `writeback` seconds before `at` or earlier, durable (lock held)."""
        h = self.history.get(path)
        if h is None or self.writeback is None:
            return
        while h and h[0][0] <= at - self.writeback:
            self.durable[path] = max(self.durable.get(path, 0), h.popleft()[1])
        if not h:
            del self.history[path]

    def wrote(self, path: str, length: int) -> None:
        """A write that left `path` `length` bytes long (kept only with a writeback)."""
        if self.writeback is None:
            return
        t = self.now()
        with self.lock:
            self._fold(path, t)
            h = self.history.setdefault(path, deque())
            if h and self.grain and t // self.grain == h[-1][0] // self.grain:
                h[-1] = (t, length)
            else:
                h.append((t, length))

    def synced(self, path: str, length: int, at: tuple[float, float] | None = None) -> None:
        """`path` fsynced at `length`, read between the times `at` (before, after reading the length)."""
        with self.lock:
            self.durable[path] = length
            self.history.pop(path, None)
            if at is not None:
                self.synced_at[path] = at

    def created(self, path: str) -> None:
        with self.lock:
            self.durable[path] = 0
            self.history.pop(path, None)

    def truncated(self, path: str, length: int) -> None:
        with self.lock:
            self.durable[path] = min(self.durable.get(path, 0), length)
            if h := self.history.get(path):
                self.history[path] = deque((t, min(n, length)) for t, n in h)

    def renamed(self, old: str, new: str) -> None:
        with self.lock:
            for table in (self.durable, self.history, self.synced_at):
                moved = {p: v for p, v in table.items() if p == old or p.startswith(old + "/")}
                for p, v in moved.items():
                    del table[p]
                    table[new + p[len(old) :]] = v  # type: ignore[index]

    def removed(self, path: str) -> None:
        with self.lock:
            self.durable.pop(path, None)
            self.history.pop(path, None)

    def lengths(self) -> dict[str, int]:
        """The durable length of every file the model knows, as of now."""
        with self.lock:
            t = self.now()
            for path in list(self.history):
                self._fold(path, t)
            return dict(self.durable)

    def cut(self, tear: bool = False, rng: random.Random | None = None) -> dict[str, tuple[int, int]]:
        """Every file back to its durable length (with `tear`, plus a random prefix of the next page's
        unsynced bytes); what each file was and is now, for those it shortened. `last_cut` keeps every
        file's account: its length before and after, and its last fsync's times (None: never)."""
        rng = rng or random.Random()
        out: dict[str, tuple[int, int]] = {}
        self.last_cut = {}
        with self.lock:
            t = self.now()
            for path in self.root.rglob("*"):
                if not path.is_file():
                    continue
                name = "/" + str(path.relative_to(self.root))
                self._fold(name, t)
                self.history.pop(name, None)  # what was not yet written back is gone
                size = path.stat().st_size
                keep = min(self.durable.get(name, 0), size)
                if tear and size > keep:
                    keep += rng.randint(0, min(PAGE - keep % PAGE, size - keep))
                if keep < size:
                    os.truncate(path, keep)
                    out[name] = (size, keep)
                self.last_cut[name] = {"before": size, "after": keep, "synced_at": self.synced_at.get(name)}
                self.durable[name] = keep
        return out
