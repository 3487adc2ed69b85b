"""Files crashbench writes are written whole or not at all: into a temporary file beside the target,
then renamed over it (atomic on one filesystem), so that two runs writing the same --out, or a run
killed mid-write, never leave a torn result or timeline for a later read; and a result and its timeline
written under one lock on their directory, so that the last of two such runs wins both files and a
result is never paired with the other run's timeline."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path to write instead of `path`; renamed over `path` once the block ends without
    an error, removed if it raises."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory` (flock on the directory itself: no lock file is left behind)
    for files that must be replaced together."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
