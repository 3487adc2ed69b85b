"""Temporary directories of a run (ledgers, worker logs, the embedded server's files).

A crashbench that is SIGKILLed cannot remove its own, so every directory carries its owner's pid,
and each session first removes those whose owner is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

_OURS = re.compile(r"^crashbench-[a-z]+-(\d+)-")


def make(kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"crashbench-{kind}-{os.getpid()}-"))


def remove_orphans() -> list[Path]:
    """Remove crashbench directories whose owner process no longer exists; return what was removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob("crashbench-*-*-*"):
        m = _OURS.match(path.name)
        if m and path.is_dir() and not psutil.pid_exists(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
