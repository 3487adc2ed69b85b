"""Hosts over SSH (crashbench.faults.hosts.ssh, crashbench.control.sshworker): real OpenSSH servers, each in
a network namespace of its own (tests/sshrig.py), the same code path a real host takes. Every count is
checked against what the harness saw itself: the ledger brought back over SFTP (whose times only line up
if the stub's clock offset is right: one host's monotonic clock runs 500 s ahead, in a time namespace),
the jobs the crash's workers were inside, and what is left on each host afterwards (processes, files,
iptables rules). Skipped with the reason where namespaces or sshd are not available."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashbench.control.ssh import SshError, SshTarget
from crashbench.control.stopflag import StopFlag
from crashbench.errors import Interrupted
from crashbench.faults.hosts.ssh import SshHost
from crashbench.model import hostclock
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, parse
from tests import sshrig

REASON = sshrig.unavailable()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"hosts over SSH: {REASON}")
AHEAD = 500.0  # host 1's monotonic clock, ahead of this machine's


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshrig.Rig]:
    with sshrig.rig(2, tmp_path_factory.mktemp("ssh"), skew=(0.0, AHEAD)) as r:
        yield r


def on(rig: sshrig.Rig, *entries: dict[str, Any], **workload: Any) -> Scenario:
    """A worker over SSH takes most of a second to start, seconds on a loaded machine, and the first to
    start runs jobs meanwhile: each run has work enough for the first three alone to take over 13 s, and its
    host fault comes at 3 s (or as soon as all four are READY, if later), so every worker is inside a job
    then, and jobs are left for after it."""
    layout = {"kind": "hosts", "slots": [[0, 1], [2, 3]], **rig.settings()}
    given = {"jobs": 160, "job_ms": 250, "workers": 4, "stale_after": 0.5, "recover_every": 0.05,
             "drain_timeout": 20, "socket_timeout": 0.5, **workload}  # fmt: skip
    return Scenario.of(name="ssh", kills=0, **given).replace(schedule=(layout, *entries))


def run_one(rig: sshrig.Rig, sc: Scenario, design: str, keep: bool = False) -> tuple[DesignRun, Timeline]:
    result = run_designs(sc, [design], Options(keep=keep))
    (run,) = result.runs
    assert run.timeline is not None and result.problems == []
    assert rig.leftovers() == []
    return run, run.timeline


def events(tl: Timeline, what: str) -> list[Any]:
    return [e for e in tl.fault_events if e.family == "hosts" and e.what == what]


def problems(*entries: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse({"faults": list(entries), "workload": {"workers": 4}}, "x.toml")
    return str(caught.value)


def test_every_problem_of_an_ssh_layout_is_named() -> None:
    layout = {"kind": "hosts", "slots": [[0, 1], [2, 3]]}
    said = problems({**layout, "ssh": ["a@h1", "b@h2:99999", "c@h3"], "python": 3})
    assert "hosts entry 1: ssh names 3 target(s) for 2 host(s): one per host" in said
    assert "hosts entry 1: ssh: 'b@h2:99999' is not an SSH target: [user@]host[:port]" in said
    assert "hosts entry 1: python must be a non-empty string, not 3" in said
    assert "hosts entry 1: ssh must be a list of targets" in problems({**layout, "ssh": "h1"})
    assert "hosts entry 1: identity is for hosts over SSH: give ssh = [...] too" in problems(
        {**layout, "identity": "k"}
    )
    crash = problems({**layout, "ssh": ["h1", "h2"]}, {"kind": "host-crash", "host": 0, "ssh": ["h"]})
    assert 'host-crash entry 2: ssh is for kind = "hosts" (the layout), not host-crash' in crash


def test_a_target_is_parsed_and_its_options_never_hold_a_key_or_a_password() -> None:
    t = SshTarget.parse("deploy@10.0.0.1:2222", identity="~/.ssh/k", known_hosts="none", python="/v/bin/python")
    assert (t.user, t.host, t.port, str(t)) == ("deploy", "10.0.0.1", 2222, "deploy@10.0.0.1:2222")
    o = t.options()
    assert o["client_keys"] == [str(Path("~/.ssh/k").expanduser())] and o["known_hosts"] is None
    assert o["password"] is None and o["agent_path"] is None
    assert SshTarget.parse("h").options().keys() == {"port", "connect_timeout", "password"}  # the defaults
    assert SshTarget.parse("[fe80::1]:22").host == "fe80::1"


def test_a_worker_s_clock_is_its_host_s_less_the_offset_it_is_given() -> None:
    code = "import time; from crashbench.model import hostclock; print(time.monotonic() - hostclock.now())"
    env = {**os.environ, hostclock.OFFSET_ENV: "500.25"}
    shifted = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert abs(float(shifted.stdout) - 500.25) < 0.01
    assert hostclock.now is time.monotonic  # here, none: the hot path is the plain clock


@needs_hosts
@pytest.mark.slow
def test_every_job_runs_on_the_hosts_and_their_ledger_lines_up_with_this_clock(rig: sshrig.Rig) -> None:
    # Enqueued once every worker is READY, so both hosts take jobs.
    run, tl = run_one(rig, on(rig, jobs=40, job_ms=100, produce="during", produce_s=1.0), "reliable", keep=True)
    assert run.workdir is not None
    logs = "".join(f.read_text() for f in Path(run.workdir, "logs").glob("w*.log"))
    shutil.rmtree(run.workdir)
    k = run.counts
    assert k.done == 40 and k.lost == k.duplicated == 0
    # Host 1's workers ran on a clock 500 s ahead: only the offset puts their records inside the run.
    on1 = [ex for ex in tl.executions if ex.worker in ("w2", "w3")]
    starts = [ex.start for ex in tl.executions]
    assert on1 and len(on1) < 40 and len(starts) == 40 and max(starts) - min(starts) < 30
    spawned = {s.worker: s.t for s in tl.spawns}
    assert all(0 < t - spawned[w] < 30 for w, t in tl.ready.items()) and max(tl.ready.values()) < min(starts)
    # Each stub measured its host's offset: about 0 for host 0, 500 s for host 1.
    offsets = sorted(float(m) for m in re.findall(r"clock offset ([-+0-9.]+) ms", logs))
    assert (
        len(offsets) == 4
        and all(abs(o) < 50 for o in offsets[:2])
        and all(abs(o - AHEAD * 1000) < 50 for o in offsets[2:])
    )


@needs_hosts
@pytest.mark.slow
def test_a_host_crash_over_ssh_kills_its_workers_and_reliable_runs_their_jobs_again(rig: sshrig.Rig) -> None:
    crash = {"kind": "host-crash", "host": 1, "at": 3.0, "downtime": 0.2}
    run, tl = run_one(rig, on(rig, crash), "reliable")
    (c,) = events(tl, "crash")
    interrupted = set(c.data["jobs"])
    assert c.data["workers"] and len(c.data["workers"]) == 2
    # From the final ledgers: what each killed worker was inside, none of it ended there.
    open_at_crash = {ex.job for ex in tl.executions if ex.worker in c.data["workers"] and ex.end is None}
    assert interrupted and open_at_crash == interrupted
    again = {ex.job for ex in tl.executions if ex.job in interrupted and ex.start > c.t}
    k = run.counts
    assert again == interrupted and k.host_crash_rerun == len(interrupted) == k.host_crash_interrupted
    assert k.host_crash_lost == k.lost == 0 and k.done == 160
    assert events(tl, "ready") and events(tl, "ready")[0].t >= events(tl, "boot")[0].t


@needs_hosts
@pytest.mark.slow
def test_a_host_crash_over_ssh_loses_what_naive_had_popped(rig: sshrig.Rig) -> None:
    crash = {"kind": "host-crash", "host": 0, "at": 3.0, "downtime": 0.2}
    run, tl = run_one(rig, on(rig, crash), "naive")
    (c,) = events(tl, "crash")
    open_in = set(c.data["jobs"])
    k = run.counts
    assert k.host_crash_interrupted == len(open_in) and k.host_crash_lost == len(open_in) and k.host_crash_rerun == 0
    started = {ex.job for ex in tl.executions}
    popped = set(run.jobs["lost"]) - open_in  # popped by a killed worker, never started: at most one each
    assert open_in and open_in <= set(run.jobs["lost"]) and not popped & started and len(popped) <= 2 - len(open_in)


@needs_hosts
@pytest.mark.slow
def test_a_host_partition_over_ssh_stops_that_host_s_work_and_only_that(rig: sshrig.Rig) -> None:
    cut = {"kind": "host-partition", "host": 0, "at": 3.0, "duration": 1.5}
    run, tl = run_one(rig, on(rig, cut), "reliable")
    (p,) = events(tl, "partition")
    (h,) = events(tl, "heal")
    on0 = {ex.worker for ex in tl.executions if ex.worker in ("w0", "w1")}
    inside = [ex for ex in tl.executions if p.t < ex.start < h.t]
    cut_off = [ex for ex in inside if ex.worker in on0]
    # A worker of host 0 may start one job whose fetch was answered just before the rule went in; no more.
    assert len(cut_off) <= 2 < len(inside) - len(cut_off)
    assert run.counts.lost == 0 and run.counts.done == 160 and run.counts.host_partitions == 1


@needs_hosts
@pytest.mark.slow
def test_a_host_pause_over_ssh_stops_every_worker_on_it_until_the_resume(rig: sshrig.Rig) -> None:
    pause = {"kind": "host-pause", "host": 1, "at": 3.0, "duration": 1.0}
    run, tl = run_one(rig, on(rig, pause, stale_after=5.0), "reliable")
    (p,) = events(tl, "pause")
    (r,) = events(tl, "resume")
    assert p.data["processes"] == 2  # its two workers, as the host's kernel reported them stopped
    frozen = [ex for ex in tl.executions if ex.worker in ("w2", "w3") and p.data["frozen_at"] < ex.start < r.t]
    assert frozen == [] and run.counts.done == 160 and run.counts.lost == 0


@needs_hosts
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["host-crash", "host-pause", "host-partition"])
def test_a_run_interrupted_during_a_host_fault_over_ssh_leaves_nothing_on_the_hosts(
    rig: sshrig.Rig, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (the stop flag) the moment the fault is made: Interrupted, and no worker, file or rule of the
    run is left on either host (a paused host's workers too, a cut-off one's rules)."""
    stop, made = StopFlag(), []
    for name in ("crash", "cut", "pause"):
        real = getattr(SshHost, name)

        def hit(self: SshHost, *args: Any, real: Any = real) -> Any:
            out = real(self, *args)
            made.append(self.index)
            stop.raised = True
            return out

        monkeypatch.setattr(SshHost, name, hit)
    fault = {"kind": kind, "host": 1, "at": 0.2, ("downtime" if kind == "host-crash" else "duration"): 30}
    with pytest.raises(Interrupted):
        run_designs(on(rig, fault, jobs=40), ["reliable"], Options(stop=stop))
    assert made == [1]
    assert rig.leftovers() == []


@needs_hosts
def test_what_a_run_would_leave_on_a_host_is_seen(rig: sshrig.Rig) -> None:
    """The leftovers check the runs above pass: it names a file in a host's TMPDIR and a rule of crashbench's."""
    (rig.tmp(0) / "crashbench-left").mkdir()
    ns = ["ip", "netns", "exec", rig.net.namespace(1), "iptables", "-w"]
    rule = ["OUTPUT", "-p", "tcp", "--dport", "1", "-m", "comment", "--comment", "crashbench-left", "-j", "DROP"]
    subprocess.run([*ns, "-I", *rule], check=True)
    try:
        left = rig.leftovers()
        assert any("crashbench-left" in x and x.startswith("host 0:") for x in left)
        assert any("crashbench-left" in x and x.startswith("host 1:") and "DROP" in x for x in left)
    finally:
        (rig.tmp(0) / "crashbench-left").rmdir()
        subprocess.run([*ns, "-D", *rule], check=True)
    assert rig.leftovers() == []


@needs_hosts
@pytest.mark.slow
def test_a_cut_between_hosts_over_ssh_drops_the_other_host_s_address_there_and_heals(
    rig: sshrig.Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """from = "hosts": the host's own iptables drops everything to and from the other host's address (read
    from its namespace while the cut is on), and the heal takes the rules out again."""
    seen: list[str] = []
    real = SshHost.cut

    def cut(self: SshHost, *args: Any) -> None:
        real(self, *args)
        rules = subprocess.run(["ip", "netns", "exec", rig.net.namespace(self.index), "iptables", "-S"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        seen.extend(r for r in rules.splitlines() if "crashbench" in r)

    monkeypatch.setattr(SshHost, "cut", cut)
    apart = {"kind": "host-partition", "host": 0, "at": 0.5, "duration": 0.5, "from": "hosts"}
    run, tl = run_one(rig, on(rig, apart, jobs=40, job_ms=50), "reliable")
    other = rig.net.worker_address(1)
    assert sorted(r.split(" -m ")[0] for r in seen) == [f"-A INPUT -s {other}/32", f"-A OUTPUT -d {other}/32"]
    assert run.counts.lost == 0 and run.counts.done == 40 and events(tl, "partition")[0].data["apart"] == [1]


@needs_hosts
def test_a_host_that_cannot_be_reached_or_cannot_run_a_worker_ends_the_run_in_one_line(rig: sshrig.Rig) -> None:
    """Checked before any worker starts: an SSH target nobody answers at, and a host whose `python` cannot
    import crashbench's worker, each one error naming the host, and nothing left on the hosts."""
    sc = on(rig)
    layout = sc.faults.schedule[0]
    unreachable = {**layout, "ssh": [rig.target(0), f"root@{rig.net.worker_address(1)}:2"]}
    with pytest.raises(SshError, match=rf"cannot reach root@{rig.net.worker_address(1)}:2 over SSH"):
        run_designs(sc.replace(schedule=(unreachable,)), ["reliable"], Options())
    no_python = {**layout, "python": "/nonexistent/python"}
    with pytest.raises(SshError, match=r"host 0 \(root@.*\) cannot run a crashbench worker") as caught:
        run_designs(sc.replace(schedule=(no_python,)), ["reliable"], Options())
    assert "python = ..." in caught.value.hint
    assert rig.leftovers() == []
