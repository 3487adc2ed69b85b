"""The memory limit a worker puts on itself before it runs jobs, when the workload has crash jobs that
die of memory (workload.crash_how = "memory": crashbench.designs.handler.crash allocates until the
limit stops it).

A cgroup v2 memory limit where crashbench can make one: as root, on a unified hierarchy whose cgroup
(the one crashbench runs in) has the memory controller enabled for its children and is writable. The
worker then makes a child cgroup of its own, `crashbench-<runner pid>-<worker>`, sets its memory.max to
what the worker uses now plus HEADROOM and moves itself in; its children (a library's pool processes,
RQ's work horse) are in it too, and the kernel's OOM killer SIGKILLs the process that blows it.
`remove_cgroups` removes them once the workers are gone.

Anywhere else `RLIMIT_AS`: the worker's address space now plus HEADROOM, inherited by every process
it forks. An allocation past it fails (MemoryError) instead of a kill; the handler then ends its
process with os._exit(OOM_EXIT), as an OOM kill would have ended it.

Which one a worker used is in its environment (ENV: "cgroup" or "rlimit"), where the handler reads it;
`method` tells the runner the same, for the result's configuration.
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

HEADROOM = 512 * 2**20  # bytes a worker may grow by before its limit stops it
ENV = "CRASHBENCH_MEMORY_LIMIT"
OOM_EXIT = 137  # what a shell shows for a process SIGKILLed (128 + 9), as the OOM killer does
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 directory, when the memory controller is enabled for its children and
    root may write there; else None."""
    if os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        path = next(line[3:] for line in lines if line.startswith("0::"))
        here = CGROUP_ROOT / path.lstrip("/")
        enabled = (here / "cgroup.subtree_control").read_text().split()
    except (OSError, StopIteration):
        return None
    return here if "memory" in enabled and os.access(here, os.W_OK) else None


def method() -> str:
    """What a worker of this machine will use: a description for the result's configuration."""
    mib = HEADROOM // 2**20
    if _own_cgroup() is not None:
        return f"cgroup v2 memory.max: the worker's memory + {mib} MiB"
    return f"RLIMIT_AS: the worker's address space + {mib} MiB (MemoryError ends the process: exit {OOM_EXIT})"


def _status(field: str) -> int:
    """A size from /proc/self/status (VmSize, VmRSS), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def limit(worker: str) -> str:
    """Put the limit on this worker process (and what it forks from now on); "cgroup" or "rlimit"."""
    here = _own_cgroup()
    if here is not None:
        try:
            mine = here / f"crashbench-{os.getppid()}-{worker}"
            mine.mkdir(exist_ok=True)
            (mine / "memory.max").write_text(str(_status("VmRSS") + HEADROOM))
            with contextlib.suppress(OSError):
                (mine / "memory.swap.max").write_text("0")  # blown, not swapped out
            (mine / "cgroup.procs").write_text(str(os.getpid()))
            os.environ[ENV] = "cgroup"
            return "cgroup"
        except OSError:
            pass  # not allowed after all (a cgroup with processes of its own): the rlimit
    size = _status("VmSize") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = size + HEADROOM if hard == resource.RLIM_INFINITY else min(size + HEADROOM, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    os.environ[ENV] = "rlimit"
    return "rlimit"


def remove_cgroups(runner_pid: int | None = None) -> None:
    """The cgroups the workers of this runner made (empty once they are gone); none made, nothing done."""
    here = _own_cgroup()
    if here is None:
        return
    for path in here.glob(f"crashbench-{runner_pid or os.getpid()}-*"):
        with contextlib.suppress(OSError):
            path.rmdir()
