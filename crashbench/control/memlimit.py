"""The memory limit a worker puts on itself before it runs jobs, when the workload has crash jobs that
die of memory (workload.crash_how = "memory": crashbench.designs.handler.crash allocates until the
limit stops it).

The first of these that this machine has (`choose`):

1. A cgroup v2 memory limit: as root, on a unified hierarchy whose cgroup (the one crashbench runs in)
   has the memory controller enabled for its children and is writable.
2. A cgroup v1 memory limit: as root, where this process's cgroup of the v1 memory hierarchy is a
   writable directory (hybrid hosts, containers, VMs that mount only v1 controllers), and the kernel
   enforces its limit: `probe` checks that once per runner, with a process of its own that allocates
   past a small limit and must be SIGKILLed for it (a sandbox that emulates the files but not the
   limit fails it, with a one-line reason, and falls through to 3).
3. `RLIMIT_AS`: the worker's address space now plus HEADROOM, inherited by every process it forks.
   An allocation past it fails (MemoryError) instead of a kill; the handler then ends its process with
   os._exit(OOM_EXIT), as an OOM kill would have ended it.

Under either cgroup the worker makes a child cgroup of its own, `crashbench-<runner pid>-<worker>`,
sets its limit (memory.max, memory.limit_in_bytes) to what the worker uses now plus HEADROOM, then
moves itself in; its children (a library's pool processes, RQ's work horse) are in it too, and the
kernel's OOM killer SIGKILLs the process that blows it. `remove_cgroups` removes them once the workers
are gone (the runner's harness on every ending, the watchdog if the runner is SIGKILLed).

Which one a worker used is in its environment (ENV: V2, V1 or RLIMIT), where the handler reads it;
`method` tells the runner the same, for the result's configuration.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HEADROOM = 512 * 2**20  # bytes a worker may grow by before its limit stops it
ENV = "CRASHBENCH_MEMORY_LIMIT"
V2, V1, RLIMIT = "cgroup", "cgroup-v1", "rlimit"  # ENV's values: what the worker used
CGROUPS = (V2, V1)  # the values under which the kernel's OOM killer ends the process
PROBE_ENV = "CRASHBENCH_CGROUP_V1_PROBE"  # the runner's probe's answer for its workers: "" (enforced) or why not
OOM_EXIT = 137  # what a shell shows for a process SIGKILLed (128 + 9), as the OOM killer does
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")
LIMIT_FILE = {V2: "memory.max", V1: "memory.limit_in_bytes"}
PROBE_LIMIT = 64 * 2**20  # the probe's cgroup limit; its process allocates up to 4 times that
PROBE_TIMEOUT = 10.0  # seconds


@dataclass(frozen=True)
class Choice:
    """What a worker of this machine uses: `kind` (V2, V1 or RLIMIT), the cgroup directory its own goes
    under (none for RLIMIT), and why a cgroup v1 that exists is not used (its probe's answer), if so."""

    kind: str
    parent: Path | None = None
    reason: str = ""


def v2_cgroup(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> Path | None:
    """This process's cgroup v2 directory, when the memory controller is enabled for its children and
    it may be written; else None."""
    if not (root / "cgroup.controllers").exists():
        return None
    try:
        lines = proc_cgroup.read_text().splitlines()
        path = next(line[3:] for line in lines if line.startswith("0::"))
        here = root / path.lstrip("/")
        enabled = (here / "cgroup.subtree_control").read_text().split()
    except (OSError, StopIteration):
        return None
    return here if "memory" in enabled and os.access(here, os.W_OK) else None


def v1_cgroup(proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = MOUNTINFO, chroot: Path = Path("/")) -> Path | None:
    """This process's cgroup directory in the v1 memory hierarchy (`N:memory:/path` in /proc/self/cgroup,
    under the mount of a `cgroup` file system with the memory option), when it may be written; else
    None. `chroot`: where the mount points are (a test's tree; the machine's is /)."""
    try:
        own = next(
            parts[2]
            for parts in (line.split(":", 2) for line in proc_cgroup.read_text().splitlines())
            if len(parts) == 3 and "memory" in parts[1].split(",")
        )
        mounts = mountinfo.read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for line in mounts:
        mine, _, theirs = line.partition(" - ")
        fields, super_fields = mine.split(), theirs.split()
        if len(fields) < 5 or len(super_fields) < 3 or super_fields[0] != "cgroup":
            continue
        if "memory" not in super_fields[2].split(","):
            continue
        mount_root, point = fields[3], fields[4]  # the mount shows the hierarchy from mount_root down
        if own != mount_root and not own.startswith(mount_root.rstrip("/") + "/"):
            continue
        here = chroot / point.lstrip("/") / own[len(mount_root.rstrip("/")) :].lstrip("/")
        if (here / "memory.limit_in_bytes").exists() and os.access(here, os.W_OK):
            return here
    return None


def choose(root: bool, v2: Path | None, v1: Path | None, probe: Callable[[Path], str]) -> Choice:
    """The order: cgroup v2, else cgroup v1 if `probe` (its reason it is not enforced, "" if it is)
    passes, else RLIMIT_AS. Only root may make cgroups."""
    if root and v2 is not None:
        return Choice(V2, v2)
    if root and v1 is not None:
        reason = probe(v1)
        return Choice(RLIMIT, None, reason) if reason else Choice(V1, v1)
    return Choice(RLIMIT)


_chosen: Choice | None = None  # this process's choice; a forked worker inherits its runner's


def choice() -> Choice:
    """This machine's choice, worked out once per process (the runner's, before it forks any worker:
    crashbench.run.harness). A worker exec'd by --worker-python reads the runner's probe in PROBE_ENV
    instead of running its own."""
    global _chosen
    if _chosen is None:
        _chosen = choose(os.geteuid() == 0, v2_cgroup(), v1_cgroup(), _probe_once)
    return _chosen


def _probe_once(parent: Path) -> str:
    if PROBE_ENV not in os.environ:
        os.environ[PROBE_ENV] = probe(parent)
    return os.environ[PROBE_ENV]


# The probe's process: into the cgroup, then allocate and touch 16 MiB at a time up to 4 times its limit.
_ALLOCATE = """
import mmap, os, sys
open(os.path.join(sys.argv[1], "cgroup.procs"), "w").write(str(os.getpid()))
held = []
try:
    while len(held) * 16 < 4 * int(sys.argv[2]):
        chunk = mmap.mmap(-1, 16 << 20)
        chunk.write(b"\\x01" * (16 << 20))
        held.append(chunk)
except (MemoryError, OSError) as exc:
    print(type(exc).__name__, exc)
    sys.exit(3)
"""


def probe(parent: Path) -> str:
    """Does the kernel enforce a cgroup v1 memory limit under `parent`? "" if a process that allocates
    past it is SIGKILLed; else one line that says what happened instead. The probe's cgroup is gone after."""
    here = parent / f"crashbench-{os.getpid()}-probe"
    mib = PROBE_LIMIT // 2**20
    try:
        here.mkdir(exist_ok=True)
        _set_v1_limit(here, PROBE_LIMIT)
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _ALLOCATE, str(here), str(mib)],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False,
        )  # fmt: skip
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:]
    except subprocess.TimeoutExpired:
        return f"cgroup v1 not enforced: a process over its memory.limit_in_bytes hung for {PROBE_TIMEOUT:.0f} s"
    except OSError as exc:
        return f"cgroup v1 not usable: {exc}"
    finally:
        _remove(here, wait=2.0)  # its process is gone, or on its way (killed by the timeout)
    if done.returncode == -signal.SIGKILL:
        return ""
    if done.returncode == 0:
        return f"cgroup v1 not enforced: a process allocated {4 * mib} MiB under a {mib} MiB memory.limit_in_bytes"
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    output = " ".join(said) or "no output"
    return f"cgroup v1 not enforced as an OOM kill: a process past memory.limit_in_bytes ended with {how} ({output})"


def _set_v1_limit(here: Path, size: int) -> None:
    (here / "memory.limit_in_bytes").write_text(str(size))
    with contextlib.suppress(OSError):  # blown, not swapped out: memory and swap together at the same bound
        (here / "memory.memsw.limit_in_bytes").write_text(str(size))
    with contextlib.suppress(OSError):  # the OOM killer on, whatever the parent says
        (here / "memory.oom_control").write_text("0")


def method() -> str:
    """What a worker of this machine will use: a description for the result's configuration (and why
    a cgroup v1 that exists is not used, if so)."""
    mib = HEADROOM // 2**20
    chosen = choice()
    if chosen.kind == V2:
        return f"cgroup v2 memory.max: the worker's memory + {mib} MiB"
    if chosen.kind == V1:
        return f"cgroup v1 memory.limit_in_bytes: the worker's memory + {mib} MiB"
    why = f"; {chosen.reason}" if chosen.reason else ""
    return f"RLIMIT_AS: the worker's address space + {mib} MiB (MemoryError ends the process: exit {OOM_EXIT}){why}"


def _status(field: str) -> int:
    """A size from /proc/self/status (VmSize, VmRSS), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def limit(worker: str) -> str:
    """Put the limit on this worker process (and what it forks from now on); V2, V1 or RLIMIT. The
    cgroup's limit is set before the worker joins it."""
    chosen = choice()
    if chosen.parent is not None:
        mine = chosen.parent / f"crashbench-{os.getppid()}-{worker}"
        try:
            mine.mkdir(exist_ok=True)
            size = _status("VmRSS") + HEADROOM
            if chosen.kind == V2:
                (mine / "memory.max").write_text(str(size))
                with contextlib.suppress(OSError):
                    (mine / "memory.swap.max").write_text("0")  # blown, not swapped out
            else:
                _set_v1_limit(mine, size)
            (mine / "cgroup.procs").write_text(str(os.getpid()))
            os.environ[ENV] = chosen.kind
            return chosen.kind
        except OSError:
            _remove(mine)  # not allowed after all (a v2 cgroup with processes of its own): the rlimit
    size = _status("VmSize") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = size + HEADROOM if hard == resource.RLIM_INFINITY else min(size + HEADROOM, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    os.environ[ENV] = RLIMIT
    return RLIMIT


def _remove(cgroup: Path, wait: float = 0.0) -> bool:
    """Remove a cgroup crashbench made; True once it is gone. A cgroup goes only once empty: with
    `wait`, whatever is still in it (a process of a worker the supervisor stopped, on its way out) is
    SIGKILLed, and the removal tried again until `wait` s have passed or nothing is left to wait for."""
    deadline = time.monotonic() + wait
    while True:
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline or not _kill_members(cgroup):
                return False
        time.sleep(0.01)


def _kill_members(cgroup: Path) -> bool:
    """SIGKILL the processes in `cgroup`; whether there were any. A pid counts only if the process
    says it is in that cgroup (/proc/PID/cgroup): a file that merely looks like cgroup.procs names no
    one to kill."""
    found = False
    with contextlib.suppress(OSError):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError, ValueError):
                lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if any(line.endswith(f"/{cgroup.name}") for line in lines):
                    found = True
                    os.kill(int(pid), signal.SIGKILL)
    return found


def _runner_gone(name: str) -> bool:
    """Is `crashbench-<pid>-...` a cgroup of a runner that no longer runs?"""
    pid = name.split("-")[1]
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()


def remove_cgroups(runner_pid: int | None = None, wait: float = 2.0) -> None:
    """The cgroups the workers of this runner made (empty once they are gone), v2 and v1 alike, and
    any left empty by a runner that is gone; none made, nothing done."""
    if os.geteuid() != 0:
        return
    mine = f"crashbench-{runner_pid or os.getpid()}-"
    for parent in {p for p in (v2_cgroup(), v1_cgroup()) if p is not None}:
        for path in parent.glob("crashbench-*-*"):
            if path.name.startswith(mine):
                _remove(path, wait)
            elif _runner_gone(path.name):
                _remove(path)
