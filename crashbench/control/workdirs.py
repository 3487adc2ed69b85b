"""Temporary directories of a run (ledgers, worker logs, the embedded server's files).

A crashbench that is SIGKILLed cannot remove its own, so every directory carries its owner's pid,
and each session first removes those whose owner is gone, except those a run decided to keep (the
`KEPT` marker): a result's `workdir` must still point at its evidence after the next run.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

_OURS = re.compile(r"^crashbench-[a-z]+-(\d+)-")


KEPT = "KEPT"  # the marker file of a directory kept on purpose (--keep, evidence problems, an error)

SHM = Path("/dev/shm")
SHM_MIN_FREE = 256 * 2**20  # a small /dev/shm (a container's 64 MB) is left alone


def _memory_dir() -> Path | None:
    """A RAM-backed directory if the machine has a roomy one: a ledger record there costs half the
    write(2) of one on disk, and records are the harness's own cost in every job. A SIGKILLed worker's
    records survive there as well as on disk (both are the page cache)."""
    try:
        if SHM.is_dir() and os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free >= SHM_MIN_FREE:
            return SHM
    except OSError:
        pass
    return None


def make(kind: str, memory: bool = False) -> Path:
    """A new directory; with `memory`, in RAM when possible (ledgers), else in the temp directory."""
    base = _memory_dir() if memory else None
    return Path(tempfile.mkdtemp(prefix=f"crashbench-{kind}-{os.getpid()}-", dir=base))


def keep(path: Path) -> None:
    """Mark `path` as kept, so that no later orphan sweep removes it; removing it is the user's call."""
    (path / KEPT).write_text("kept by crashbench: remove this directory by hand when done with it\n")


def remove_orphans() -> list[Path]:
    """Remove crashbench directories whose owner process no longer exists and that were not kept on
    purpose; return what was removed."""
    removed = []
    bases = [Path(tempfile.gettempdir()), *([SHM] if SHM.is_dir() else [])]
    for path in (p for base in bases for p in base.glob("crashbench-*-*-*")):
        m = _OURS.match(path.name)
        if m and path.is_dir() and not (path / KEPT).exists() and not psutil.pid_exists(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
