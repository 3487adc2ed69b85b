"""A lazy file system: a FUSE pass-through over a backing directory that remembers, per file, how much of
it was durable at its last fsync, and on a power cut forgets the rest (issue 31, as Jepsen's lazyfs).

Every operation goes straight through to the backing directory (no cache of its own: the kernel's page
cache is off, direct_io, attributes never cached), so a server on the mount reads and writes as on any
directory. What it adds is the model of a disk cache: a file's durable length is its length at its last
fsync or fdatasync (a file that existed at the mount is durable whole); `power_cut()` truncates every
file back to it, optionally tearing the last page (a prefix of the unsynced bytes, up to 4 KiB, stays).
Appends are what this models (Redis's AOF only appends; an overwrite of durable bytes is not undone). A
rename carries the file's durable length to its new name: a temporary file renamed into place (an AOF
rewrite's, a manifest's) is durable as far as it was fsynced, never by the rename. Directory operations
themselves are taken as durable (Redis fsyncs the directory after its renames). The cut is asked of the
mount's own process by writing to CONTROL, a name no directory lists, so it runs where the lengths are
known, between two file system operations; a read of CONTROL returns the durable lengths (`durable()`).
The backing files are never fsynced for real: the model is the disk, the backing directory only holds
the bytes.

The kernel's writeback (`writeback`, seconds; None, the default: only an fsync makes bytes durable): a
server that never fsyncs (Redis's `appendfsync no`) still has its bytes on the disk once the kernel writes
its dirty pages back (Linux: dirty_expire_centisecs, 30 s, checked every dirty_writeback_centisecs, 5 s).
With it, bytes written at t are durable from t + writeback on: a file's durable length is the larger of
its fsynced length and its length as it was `writeback` seconds ago (durability.Durability keeps a short
history of each file's writes since its last durable point). The model is that delay exactly: the
kernel's flusher makes it 30 to 35 s, and writes back under memory pressure sooner.

What it costs (lab/lazyfs_cost.py, docs/findings/power.md): with `appendfsync always` every event-loop
iteration of the server is one write and one fsync, each a round trip through FUSE to this process; no
other operation comes per write (the kernel keeps an open file's size itself, so there is no getattr on
the hot path, and caching attributes would buy nothing). The FUSE loop is single-threaded (a callback on
libfuse's own threads pays the GIL's hand-over) and the write path calls pwrite itself. Attributes and
entries are never cached (attr_timeout, entry_timeout 0) and the page cache is off (direct_io) on
purpose: the cut truncates files underneath the kernel, and whatever it had cached of them would be
stale. That a server killed at the cut holds an open file whose size the kernel still remembers is
harmless: the cut comes after its SIGKILL, and the restarted server opens every file again, which
fetches its attributes afresh.

`LazyFS` runs the mount as a process of its own (python -m crashbench.control.lazyfs BACKING MOUNT
[--writeback SECONDS]; crashbench.control.lazyfs.mount), in
its own session, dying with crashbench, mounted with auto_unmount (fusermount3 unmounts it if that
process dies) and unmounted with fusermount3 -u on every ending. It needs root, /dev/fuse, fusermount3
(Debian's fuse3) and the mfusepy package: `unavailable()` says which is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from crashbench.control.lazyfs.durability import PAGE, WRITEBACK_GRAIN, Durability
from crashbench.control.lazyfs.mount import CONTROL, FSNAME, record
from crashbench.control.reaper import become_subreaper, die_with_parent, end_sessions

__all__ = ["CONTROL", "FSNAME", "PAGE", "WRITEBACK_GRAIN", "Durability", "LazyFS", "unavailable"]


def unavailable() -> str:
    """Why a lazy file system cannot be mounted here, or ""."""
    if os.geteuid() != 0:
        return "a lazy file system (FUSE) needs root: run crashbench as root"
    if not os.path.exists("/dev/fuse"):
        return "a lazy file system (FUSE) needs /dev/fuse, which this machine (container) does not have"
    if shutil.which("fusermount3") is None:
        return "a lazy file system (FUSE) needs fusermount3: apt-get install fuse3"
    if importlib.util.find_spec("mfusepy") is None:
        return "a lazy file system (FUSE) needs the mfusepy package: pip install 'crashbench[power]'"
    return ""


class LazyFS:
    """A lazy file system over `backing`, mounted at `mount` by a process of its own."""

    def __init__(self, backing: Path, mount: Path, writeback: float | None = None) -> None:
        self.backing, self.mount, self.writeback = backing, mount, writeback
        self.proc: subprocess.Popen[bytes] | None = None
        self.helpers: list[psutil.Process] = []
        self.log = backing.parent / f"{backing.name}.lazyfs.log"

    def start(self, timeout: float = 10.0) -> None:
        become_subreaper()  # fusermount3's auto_unmount helper, which outlives the mount, stays ours to reap
        before = {p.pid for p in _fusermounts()}
        args = [sys.executable, "-m", "crashbench.control.lazyfs", str(self.backing), str(self.mount)]
        if self.writeback is not None:
            args += ["--writeback", repr(float(self.writeback))]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise OSError(f"the lazy file system did not mount at {self.mount}: {self._log_tail()}")
            time.sleep(0.01)
        # fusermount3's auto_unmount helper (it unmounts if the mount's process dies): a session of its
        # own, re-parented to us once the fusermount3 that forked it exits; reaped in `stop`.
        self.helpers = [p for p in _fusermounts() if p.pid not in before]

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-1000:].strip() if self.log.exists() else ""

    def durable(self) -> dict[str, int]:
        """The durable length of every file now ("/name": bytes), as the mount's process has it."""
        return dict(json.loads((self.mount / CONTROL).read_bytes()))

    def power_cut(self, tear: bool = False) -> dict[str, dict[str, Any]]:
        """Every file back to what was durable: fsynced, or written back (the writer must be dead:
        nothing writes meanwhile). Per file ("/a/b"): its length before and after, and its last fsync's
        CLOCK_MONOTONIC times (Durability.synced_at; None: never), as the mount's process kept them."""
        with open(self.mount / CONTROL, "wb", buffering=0) as ctl:
            ctl.write(b"tear" if tear else b"cut")
        out: dict[str, dict[str, Any]] = json.loads(record(self.backing).read_text())
        return out

    def stop(self) -> None:
        """Unmount (lazily if busy) and end the mount's process; a no-op when it never started."""
        if os.path.ismount(self.mount):
            for args in (["-u"], ["-u", "-z"]):
                done = subprocess.run(["fusermount3", *args, str(self.mount)], capture_output=True, check=False)
                if done.returncode == 0:
                    break
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            end_sessions({p.pid for p in self.helpers} | {self.proc.pid}, grace=2.0)
        self.log.unlink(missing_ok=True)
        record(self.backing).unlink(missing_ok=True)


def _fusermounts() -> list[psutil.Process]:
    """fusermount3 processes of ours (the children of this process and theirs)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "fusermount3":
                out.append(p)
    return out
