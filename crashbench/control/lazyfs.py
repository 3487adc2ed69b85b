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
known, between two file system operations. The backing files are never fsynced for real: the model is
the disk, the backing directory only holds the bytes.

`LazyFS` runs the mount as a process of its own (python -m crashbench.control.lazyfs BACKING MOUNT), in
its own session, dying with crashbench, mounted with auto_unmount (fusermount3 unmounts it if that
process dies) and unmounted with fusermount3 -u on every ending. It needs root, /dev/fuse, fusermount3
(Debian's fuse3) and the mfusepy package: `unavailable()` says which is missing.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from crashbench.control.reaper import become_subreaper, die_with_parent, end_sessions

CONTROL = ".crashbench-power-cut"  # write "cut" or "tear" to MOUNT/CONTROL: the power cut
PAGE = 4096
FSNAME = "crashbench-lazyfs"  # its mounts in /proc/mounts


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


class Durability:
    """The durable length of each file (paths relative to the root, "/a/b"), and the cut; thread-safe."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.durable: dict[str, int] = {}
        for path in root.rglob("*"):
            if path.is_file():
                self.durable["/" + str(path.relative_to(root))] = path.stat().st_size

    def synced(self, path: str, length: int) -> None:
        with self.lock:
            self.durable[path] = length

    def created(self, path: str) -> None:
        with self.lock:
            self.durable[path] = 0

    def truncated(self, path: str, length: int) -> None:
        with self.lock:
            self.durable[path] = min(self.durable.get(path, 0), length)

    def renamed(self, old: str, new: str) -> None:
        with self.lock:
            moved = {p: n for p, n in self.durable.items() if p == old or p.startswith(old + "/")}
            for p, n in moved.items():
                del self.durable[p]
                self.durable[new + p[len(old) :]] = n

    def removed(self, path: str) -> None:
        with self.lock:
            self.durable.pop(path, None)

    def cut(self, tear: bool = False, rng: random.Random | None = None) -> dict[str, tuple[int, int]]:
        """Every file back to its durable length (with `tear`, plus a random prefix of the next page's
        unsynced bytes); what each file was and is now, for those it shortened."""
        rng = rng or random.Random()
        out: dict[str, tuple[int, int]] = {}
        with self.lock:
            for path in self.root.rglob("*"):
                if not path.is_file():
                    continue
                name = "/" + str(path.relative_to(self.root))
                size = path.stat().st_size
                keep = min(self.durable.get(name, 0), size)
                if tear and size > keep:
                    keep += rng.randint(0, min(PAGE - keep % PAGE, size - keep))
                if keep < size:
                    os.truncate(path, keep)
                    out[name] = (size, keep)
                self.durable[name] = keep
        return out


def operations(backing: Path) -> Any:
    """The mfusepy Operations of a lazy file system over `backing`."""
    import mfusepy as fuse

    state = Durability(backing)

    def real(path: str) -> str:
        return str(backing) + path

    class Lazy(fuse.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.state = state
            self.control_fh = 1 << 40  # no real descriptor is ever this

        def _ctl(self, path: str) -> bool:
            return path == "/" + CONTROL

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            if self._ctl(path):
                return {"st_mode": 0o100600, "st_nlink": 1, "st_size": 0}
            try:
                st = os.lstat(real(path))
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_dev", "st_blocks")
            out: dict[str, Any] = {k: getattr(st, k) for k in keys}
            out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return out

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(real(path))]

        def access(self, path: str, amode: int) -> int:
            if not self._ctl(path) and not os.access(real(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def open(self, path: str, flags: int) -> int:
            if self._ctl(path):
                return self.control_fh
            return _call(fuse, os.open, real(path), flags)

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            fd = _call(fuse, os.open, real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            self.state.created(path)
            return int(fd)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return bytes(_call(fuse, os.pread, fh, size, offset))

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            if fh == self.control_fh:
                self.state.cut(tear=data.strip() == b"tear")
                return len(data)
            try:
                return os.pwrite(fh, data, offset)
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            if self._ctl(path):
                return 0
            _call(fuse, os.truncate, real(path), length)
            self.state.truncated(path, length)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            self.state.synced(path, os.fstat(fh).st_size)  # the model is the disk: no real fsync
            return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            if fh != self.control_fh:
                os.close(fh)
            return 0

        def rename(self, old: str, new: str) -> int:
            _call(fuse, os.rename, real(old), real(new))
            self.state.renamed(old, new)
            return 0

        def unlink(self, path: str) -> int:
            _call(fuse, os.unlink, real(path))
            self.state.removed(path)
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            return int(_call(fuse, os.mkdir, real(path), mode) or 0)

        def rmdir(self, path: str) -> int:
            return int(_call(fuse, os.rmdir, real(path)) or 0)

        def chmod(self, path: str, mode: int) -> int:
            return int(_call(fuse, os.chmod, real(path), mode) or 0)

        def chown(self, path: str, uid: int, gid: int) -> int:
            return int(_call(fuse, os.chown, real(path), uid, gid) or 0)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            return int(_call(fuse, os.utime, real(path), ns=times) if times else os.utime(real(path)) or 0)

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_frsize")
            return {k: getattr(st, k) for k in (*keys, "f_flag", "f_namemax")}

    return Lazy()


def _call(fuse: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        raise fuse.FuseOSError(exc.errno) from None


class LazyFS:
    """A lazy file system over `backing`, mounted at `mount` by a process of its own."""

    def __init__(self, backing: Path, mount: Path) -> None:
        self.backing, self.mount = backing, mount
        self.proc: subprocess.Popen[bytes] | None = None
        self.helpers: list[psutil.Process] = []
        self.log = backing.parent / f"{backing.name}.lazyfs.log"

    def start(self, timeout: float = 10.0) -> None:
        become_subreaper()  # fusermount3's auto_unmount helper, which outlives the mount, stays ours to reap
        before = {p.pid for p in _fusermounts()}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "crashbench.control.lazyfs", str(self.backing), str(self.mount)],
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

    def power_cut(self, tear: bool = False) -> None:
        """Every file back to what was fsynced (the writer must be dead: nothing writes meanwhile)."""
        with open(self.mount / CONTROL, "wb", buffering=0) as ctl:
            ctl.write(b"tear" if tear else b"cut")

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


def _fusermounts() -> list[psutil.Process]:
    """fusermount3 processes of ours (the children of this process and theirs)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "fusermount3":
                out.append(p)
    return out


def main(argv: list[str]) -> None:
    import mfusepy as fuse

    backing, mount = Path(argv[0]), argv[1]
    opts = {"attr_timeout": 0, "entry_timeout": 0, "negative_timeout": 0}
    opts["fsname"] = FSNAME
    # One thread (nothreads): every operation is a short local system call, and a callback on one of
    # libfuse's own threads costs the hand-over of the GIL (about 1.35x the AOF-always throughput of the
    # multithreaded loop, lab/lazyfs_cost.py); operations then also run one at a time, the cut included.
    fuse.FUSE(operations(backing), mount, foreground=True, nothreads=True, direct_io=True, auto_unmount=True, **opts)


if __name__ == "__main__":
    main(sys.argv[1:])
