"""The environment a result records: versions of everything that shaped its figures (Python, redis-py,
the server, the libraries), the machine, and crashbench's own commit, if it runs from a checkout."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from crashbench import __version__
from crashbench.control import connect
from crashbench.model.results import Environment
from crashbench.model.server import ServerInfo


def _git(*args: str) -> str | None:
    try:
        cp = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cp.stdout.strip() if cp.returncode == 0 else None


def environment(
    server: ServerInfo, libraries: dict[str, str], worker_python: str | None = None,
    library_pythons: dict[str, str] | None = None,
) -> Environment:  # fmt: skip
    """Versions of everything that shaped the figures; the commit is crashbench's own checkout, if any."""
    commit = _git("rev-parse", "HEAD")
    # Saved results are not code: a make target that clears its result directory first, then measures,
    # is measuring the commit all the same.
    status = (
        _git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", ":(top,exclude)results")
        if commit
        else None
    )
    return Environment(
        crashbench=__version__,
        python=platform.python_version(),
        redis_py=metadata.version("redis"),
        platform=f"{platform.system()} {platform.release()} {platform.machine()} ({sys.platform})",
        machine=platform.node(),
        cpus=os.cpu_count() or 1,
        server_name=server.name,
        server_version=server.version,
        server_binary=server.binary,
        server_mode=server.mode,
        server_primaries=server.primaries,
        server_replicas=server.replicas,
        server_url=server.shown_url,
        server_db=connect.database_of(server.url),
        commit=commit,
        dirty=bool(status) if status is not None else None,
        libraries=libraries,
        worker_python=worker_python,
        library_pythons=library_pythons or {},
    )
