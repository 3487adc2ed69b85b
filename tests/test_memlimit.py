"""The memory limit of a memory crash job (crashbench.control.memlimit): which limit a machine gets, in
what order, and on a machine with a writable cgroup v1 memory controller, a real worker process that
the kernel's OOM killer SIGKILLs in its cgroup, with no cgroup left behind by any ending of a run.
Real processes and real cgroups; the order's unit tests read /proc-like files written here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from crashbench.control import memlimit
from crashbench.designs.handler import crash
from crashbench.errors import ExitCode
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs

ROOT = Path(__file__).resolve().parent.parent


def _this_machine_has_v1() -> str:
    """Why the cgroup v1 tests cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "not root: crashbench makes no cgroup"
    if memlimit.v2_cgroup() is not None:
        return "a usable cgroup v2 memory controller here: crashbench takes v2, not v1"
    if memlimit.v1_cgroup() is None:
        return "no writable cgroup v1 memory controller for this process"
    return ""


needs_v1 = pytest.mark.skipif(bool(_this_machine_has_v1()), reason=_this_machine_has_v1() or "-")


def leftovers(runner: int) -> list[Path]:
    """The cgroups of `runner`'s workers still there, v2 and v1."""
    parents = [p for p in (memlimit.v2_cgroup(), memlimit.v1_cgroup()) if p is not None]
    return [c for p in parents for c in p.glob(f"crashbench-{runner}-*")]


# -- the order, on files written here -------------------------------------------------------------


def test_the_order_is_cgroup_v2_then_an_enforced_cgroup_v1_then_rlimit(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    probed: list[Path] = []

    def enforced(parent: Path) -> str:
        probed.append(parent)
        return ""

    def not_enforced(parent: Path) -> str:
        probed.append(parent)
        return "cgroup v1 not enforced: a process allocated 256 MiB under a 64 MiB memory.limit_in_bytes"

    assert memlimit.choose(True, v2, v1, enforced) == memlimit.Choice(memlimit.V2, v2)
    assert probed == []  # v2 first: v1 is not even probed
    assert memlimit.choose(True, None, v1, enforced) == memlimit.Choice(memlimit.V1, v1)
    assert probed == [v1]
    chosen = memlimit.choose(True, None, v1, not_enforced)
    assert (chosen.kind, chosen.parent) == (memlimit.RLIMIT, None)
    assert chosen.reason.startswith("cgroup v1 not enforced") and "\n" not in chosen.reason
    assert memlimit.choose(True, None, None, enforced) == memlimit.Choice(memlimit.RLIMIT)
    probed.clear()
    for v2_, v1_ in ((v2, v1), (None, v1), (v2, None)):  # not root: no cgroup, whatever there is
        assert memlimit.choose(False, v2_, v1_, enforced) == memlimit.Choice(memlimit.RLIMIT)
    assert probed == []


def _tree(tmp_path: Path, proc_cgroup: str, mountinfo: str) -> tuple[Path, Path]:
    (tmp_path / "cgroup").write_text(proc_cgroup)
    (tmp_path / "mountinfo").write_text(mountinfo)
    return tmp_path / "cgroup", tmp_path / "mountinfo"


V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 {root} /sys/fs/cgroup/{point} rw,relatime - cgroup cgroup rw,{options}
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


@pytest.mark.parametrize(
    ("line", "mount_root", "point", "options", "found"),
    [
        ("4:memory:/process_api/abc", "/", "memory", "memory", "sys/fs/cgroup/memory/process_api/abc"),
        ("4:cpu,memory:/job/7", "/", "cpu,memory", "cpu,memory", "sys/fs/cgroup/cpu,memory/job/7"),
        # A cgroup namespace's view: the mount shows the hierarchy from /job down.
        ("4:memory:/job/7", "/job", "memory", "memory", "sys/fs/cgroup/memory/7"),
        ("4:memory:/other", "/job", "memory", "memory", None),  # not under what is mounted
        ("4:cpu:/x", "/", "memory", "memory", None),  # not in the memory hierarchy
        ("4:memory:/x", "/", "memory", "cpu", None),  # no cgroup file system with the memory option
    ],
)
def test_the_v1_memory_cgroup_is_found_from_proc_self_cgroup_and_mountinfo(
    tmp_path: Path, line: str, mount_root: str, point: str, options: str, found: str | None
) -> None:
    proc, mounts = _tree(
        tmp_path, f"9:name=systemd:/\n{line}\n0::/\n", V1_MOUNTS.format(root=mount_root, point=point, options=options)
    )
    for where in ("sys/fs/cgroup/memory/process_api/abc", "sys/fs/cgroup/cpu,memory/job/7", "sys/fs/cgroup/memory/7"):
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    expected = tmp_path / found if found else None
    assert memlimit.v1_cgroup(proc, mounts, chroot=tmp_path) == expected
    if found:  # a directory with no memory.limit_in_bytes is not a memory cgroup
        (tmp_path / found / "memory.limit_in_bytes").unlink()
        assert memlimit.v1_cgroup(proc, mounts, chroot=tmp_path) is None


def test_the_v2_cgroup_needs_the_memory_controller_enabled_for_its_children(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    (root / "run" / "me").mkdir(parents=True)
    proc.write_text("0::/run/me\n")
    assert memlimit.v2_cgroup(root, proc) is None  # no unified hierarchy mounted there
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "run" / "me" / "cgroup.subtree_control").write_text("cpu pids\n")
    assert memlimit.v2_cgroup(root, proc) is None
    (root / "run" / "me" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert memlimit.v2_cgroup(root, proc) == root / "run" / "me"
    proc.write_text("4:memory:/run/me\n")  # a v1-only process: no 0:: line
    assert memlimit.v2_cgroup(root, proc) is None


def test_a_cgroup_v1_that_does_not_enforce_its_limit_is_found_out_once_and_rlimit_taken(tmp_path: Path) -> None:
    # A sandbox that emulates the files but not the limit: here, plain files in a plain directory.
    # The probe's real process joins "it", allocates four times the limit, and lives.
    chosen = memlimit.choose(True, None, tmp_path, memlimit.probe)
    assert chosen == memlimit.Choice(memlimit.RLIMIT, None, chosen.reason)
    assert chosen.reason == "cgroup v1 not enforced: a process allocated 256 MiB under a 64 MiB memory.limit_in_bytes"


# -- this machine's cgroup v1 -----------------------------------------------------------------------


@needs_v1
def test_on_this_machine_the_workers_take_cgroup_v1_and_its_probe_leaves_nothing() -> None:
    chosen = memlimit.choice()
    assert (chosen.kind, chosen.parent, chosen.reason) == (memlimit.V1, memlimit.v1_cgroup(), "")
    assert memlimit.method().startswith("cgroup v1 memory.limit_in_bytes")
    assert memlimit.probe(memlimit.v1_cgroup()) == ""  # the kernel SIGKILLed the probe's process
    assert leftovers(os.getpid()) == []


def _worker(name: str, told: int, go: int) -> None:
    """In a forked child of this test (its "runner"): limit itself as a worker does, say which limit,
    wait for the go, then run a memory crash job. Never returns."""
    try:
        os.write(told, memlimit.limit(name).encode())
        os.read(go, 1)
        crash("memory")
    finally:
        os._exit(99)  # not reached: crash never returns


@needs_v1
def test_a_worker_under_cgroup_v1_is_sigkilled_by_the_oom_killer_and_its_cgroup_removed() -> None:
    memlimit.choice()  # the runner's probe, before any worker is forked (crashbench.run.harness)
    name = f"t{time.monotonic_ns()}"
    told_r, told_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _worker(name, told_w, go_r)
    try:
        assert os.read(told_r, 32).decode() == memlimit.V1
        mine = memlimit.v1_cgroup() / f"crashbench-{os.getpid()}-{name}"  # type: ignore[operator]
        # The worker is in its cgroup, whose limit was set before it joined: its memory + HEADROOM.
        assert str(pid) in (mine / "cgroup.procs").read_text().split()
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        assert any(":memory:" in line and line.endswith(f"/{mine.name}") for line in lines), lines
        size = int((mine / "memory.limit_in_bytes").read_text())
        assert memlimit.HEADROOM <= size < memlimit.HEADROOM + 512 * 2**20
        os.write(go_w, b"g")
        _, status = os.waitpid(pid, 0)
        # What the kernel did: SIGKILL (the OOM killer), not MemoryError's exit 137 or the handler's cap.
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        oom = dict(line.split() for line in (mine / "memory.oom_control").read_text().splitlines())
        assert int(oom["oom_kill"]) == 1  # the kernel's count of OOM kills in the worker's cgroup
    finally:
        for fd in (told_r, told_w, go_r, go_w):
            os.close(fd)
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        memlimit.remove_cgroups()
    assert not mine.exists()
    assert leftovers(os.getpid()) == []


@needs_v1
def test_a_crash_run_under_cgroup_v1_loses_the_crash_job_and_leaves_no_cgroup() -> None:
    sc = Scenario.of(jobs=40, job_ms=1, workers=2, kills=0, crash_rate=0.05, crash_how="memory", drain_timeout=3)
    run = run_designs(sc, ["naive"], Options()).runs[0]
    assert run.configuration["crash_memory_limit"].startswith("cgroup v1 memory.limit_in_bytes")
    assert run.counts.lost == run.counts.crash_attempts >= 1 and run.counts.worker_crashes == 0
    assert leftovers(os.getpid()) == []


@needs_v1
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_runner_interrupted_or_killed_leaves_no_cgroup(sig: signal.Signals, tmp_path: Path) -> None:
    # SIGINT: the runner stops its workers and removes their cgroups; SIGKILL: its watchdog does.
    args = ["run", "-d", "reliable", "--jobs", "20000", "--workers", "2", "--kills", "0", "--out", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *args, "--crash-rate", "0.001", "--crash-how", "memory"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(leftovers(proc.pid)) < 2:  # both workers in their cgroups
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the workers never made their cgroups"
            time.sleep(0.05)
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if sig == signal.SIGINT:
        assert proc.returncode == ExitCode.INTERRUPTED, stderr
    _, alive = psutil.wait_procs(family, timeout=10)
    assert [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    deadline = time.monotonic() + 10  # the watchdog's removal follows the runner's death
    while leftovers(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(proc.pid) == []


@needs_v1
def test_a_process_still_in_a_worker_s_cgroup_when_the_run_ends_is_killed_and_the_cgroup_removed() -> None:
    mine = memlimit.v1_cgroup() / f"crashbench-{os.getpid()}-straggler"  # type: ignore[operator]
    mine.mkdir()
    straggler = subprocess.Popen(["sleep", "60"])
    try:
        (mine / "cgroup.procs").write_text(str(straggler.pid))
        memlimit.remove_cgroups()
        assert straggler.wait(timeout=5) == -signal.SIGKILL
    finally:
        straggler.kill()
        straggler.wait()
        memlimit.remove_cgroups()
    assert leftovers(os.getpid()) == []
