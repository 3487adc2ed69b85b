"""The mount's own process: the FUSE operations of the lazy file system over a backing directory
(crashbench.control.lazyfs), run by `python -m crashbench.control.lazyfs BACKING MOUNT [--writeback S]`."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

from crashbench.control.lazyfs.durability import Durability

CONTROL = ".crashbench-power-cut"  # write "cut" or "tear" to MOUNT/CONTROL: the power cut; read it: the durable lengths
FSNAME = "crashbench-lazyfs"  # its mounts in /proc/mounts


def record(backing: Path) -> Path:
    """Where the mount's process writes its last cut's account: beside the backing directory, not in it."""
    return backing.parent / f"{backing.name}.cut.json"


def operations(backing: Path, writeback: float | None = None) -> Any:
    """The mfusepy Operations of a lazy file system over `backing`."""
    import mfusepy as fuse

    state = Durability(backing, writeback)

    def real(path: str) -> str:
        return str(backing) + path

    class Lazy(fuse.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.state = state
            self.control_fh = 1 << 40  # no real descriptor is ever this
            self.report = b""  # what a read of CONTROL returns: the durable lengths when it was opened

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
                self.report = json.dumps(self.state.lengths()).encode()
                return self.control_fh
            return _call(fuse, os.open, real(path), flags)

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            fd = _call(fuse, os.open, real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            self.state.created(path)
            return int(fd)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            if fh == self.control_fh:
                return self.report[offset : offset + size]
            return bytes(_call(fuse, os.pread, fh, size, offset))

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            if fh == self.control_fh:
                self.state.cut(tear=data.strip() == b"tear")
                record(backing).write_text(json.dumps(self.state.last_cut))  # the cut's account, for power_cut
                return len(data)
            try:
                n = os.pwrite(fh, data, offset)
                if self.state.writeback is not None:
                    self.state.wrote(path, os.fstat(fh).st_size)
                return n
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            if self._ctl(path):
                return 0
            _call(fuse, os.truncate, real(path), length)
            self.state.truncated(path, length)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            before = time.monotonic()
            size = os.fstat(fh).st_size
            self.state.synced(path, size, (before, time.monotonic()))  # the model is the disk: no real fsync
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


def main(argv: list[str]) -> None:
    import mfusepy as fuse

    backing, mount = Path(argv[0]), argv[1]
    writeback = float(argv[3]) if argv[2:3] == ["--writeback"] else None
    opts = {"attr_timeout": 0, "entry_timeout": 0, "negative_timeout": 0}
    opts["fsname"] = FSNAME
    # One thread (nothreads): every operation is a short local system call, and a callback on one of
    # libfuse's own threads costs the hand-over of the GIL (about 1.35x the AOF-always throughput of the
    # multithreaded loop, lab/lazyfs_cost.py); operations then also run one at a time, the cut included.
    fuse.FUSE(
        operations(backing, writeback),
        mount,
        foreground=True,
        nothreads=True,
        direct_io=True,
        auto_unmount=True,
        **opts,
    )
