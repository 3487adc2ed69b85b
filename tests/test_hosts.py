"""The hosts family (crashbench.faults.hosts): worker slots on hosts, each a network and a PID namespace, on
a real server with real workers. Every count is checked against the ledger on its own: the jobs open in a
crashed host's workers, which of them ran again; every process of a host stopped during its pause; no
namespace, init, worker or iptables rule left behind on any ending. Skipped, with the reason, where this
machine cannot make namespaces (not root, no iptables, an unprivileged container); the validation and
the message without root need none of it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest

from crashbench import scenario
from crashbench.control import pidns
from crashbench.control.stopflag import StopFlag
from crashbench.errors import Interrupted, UsageError
from crashbench.faults import hosts, netns
from crashbench.faults.hosts import machine
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline
from crashbench.report import html
from crashbench.run.session import Options, run_designs
from crashbench.scenario import ScenarioError, parse
from tests.conftest import assert_recounts
from tests.expectations import assert_each_can_fail, failing

REASON = machine.unavailable()
needs_root = pytest.mark.skipif(REASON is not None, reason=f"hosts: {REASON}")
LAYOUT = {"kind": "hosts", "slots": [[0, 1], [2, 3]]}
NS_EXEC = ["ip", "netns", "exec"]


def on_hosts(*entries: dict[str, Any], **workload: Any) -> Scenario:
    given = {"jobs": 160, "job_ms": 25, "workers": 4, "stale_after": 0.5, "recover_every": 0.05,
             "drain_timeout": 20, "socket_timeout": 0.5, **workload}  # fmt: skip
    return Scenario.of(name="hosts", kills=0, **given).replace(schedule=(LAYOUT, *entries))


def events(tl: Timeline, what: str) -> list[Any]:
    return [e for e in tl.fault_events if e.family == "hosts" and e.what == what]


def leftovers() -> list[str]:
    """What a run of this process left: namespaces and chains named for it, processes below it in
    another PID namespace."""
    mine = f"cb-{os.getpid()}"
    left = [
        n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split() if mine in n
    ]
    left += [
        r for r in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout.splitlines() if mine in r
    ]
    own = os.stat("/proc/self/ns/pid").st_ino
    for p in psutil.Process().children(recursive=True):
        try:
            if os.stat(f"/proc/{p.pid}/ns/pid").st_ino != own:
                left.append(f"process {p.pid} ({p.name()}) in another PID namespace")
        except OSError:
            continue
    return left


def run_one(sc: Scenario, design: str, saved: Path | None = None) -> tuple[DesignRun, Timeline]:
    result = run_designs(sc, [design], Options())
    (run,) = result.runs
    assert run.timeline is not None and result.problems == []
    if saved is not None:  # its events saved with the timeline: every count again from them; its bands drawn
        assert_recounts(result, saved)
        page = html.render(result, [run.timeline])
        assert page.count('<g class="band host crash">') == 1 and ".band.host rect{" in page
    assert leftovers() == []
    return run, run.timeline


# -- validation: one line per bad entry, no namespace needed ---------------------------------------


def problems(*entries: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse({"faults": list(entries), "workload": {"workers": 4}}, "x.toml")
    return str(caught.value)


def test_every_problem_of_a_layout_is_named() -> None:
    assert "hosts entry 1: slots must be a list of hosts" in problems({"kind": "hosts", "slots": 3})
    assert "hosts entry 1: slots must be a list of hosts" in problems({"kind": "hosts"})
    said = problems({"kind": "hosts", "slots": [[0, 1], [], [4], [1, 2]]})
    assert "hosts entry 1: host 1 must be a non-empty list of worker slots, 0 to 3, not []" in said
    assert "hosts entry 1: host 2 must be a non-empty list of worker slots, 0 to 3, not [4]" in said
    assert "hosts entry 1: slot 1 is on host 0 and host 3: a slot is on one host" in said
    assert "hosts entry 1: at is for a host fault, not the hosts' layout" in problems({**LAYOUT, "at": 1})
    assert "hosts entry 2: a run has one layout of hosts (the first is entry 1)" in problems(LAYOUT, LAYOUT)


def test_every_problem_of_a_host_fault_is_named() -> None:
    def one(**entry: Any) -> str:
        return problems(LAYOUT, {"kind": "host-crash", "host": 0, **entry})

    assert "host-crash entry 2: host must be a host, 0 to 1, not 2" in one(host=2)
    assert "host-crash entry 2: host must be a host, 0 to 1, not True" in one(host=True)
    assert "host-crash entry 2: at must be a number of seconds from 0, not -1" in one(at=-1)
    assert "host-crash entry 2: downtime must be a number of seconds from 0, not 'long'" in one(downtime="long")
    assert "host-crash entry 2: duration is not for host-crash: its length is its downtime" in one(duration=1)
    assert 'host-crash entry 2: slots is for kind = "hosts" (the layout), not host-crash' in one(slots=[[0]])
    pause = problems(LAYOUT, {"kind": "host-pause", "host": 1, "downtime": 1, "duration": -2})
    assert "host-pause entry 2: downtime is not for host-pause: its length is its duration" in pause
    assert "host-pause entry 2: duration must be a number of seconds from 0, not -2" in pause
    assert "host-partition entry 2: host is missing" in problems(LAYOUT, {"kind": "host-partition"})
    assert "host-crash entry 2: from is for host-partition (what it is cut off from), not host-crash" in one(
        **{"from": "hosts"}
    )
    three = {"kind": "hosts", "slots": [[0], [1], [2, 3]]}
    for bad in ("moon", [], [0], [1, 1], [3], [True], [1.0], 1):
        said = problems(three, {"kind": "host-partition", "host": 0, "from": bad})
        line = f'entry 2: from must be "server", "hosts" or a list of other hosts (1, 2), each once, not {bad!r}'
        assert [x for x in said.splitlines() if "from" in x and line in x] and said.count("from") == 1, (bad, said)
    alone = problems({"kind": "hosts", "slots": [[0, 1, 2, 3]]}, {"kind": "host-partition", "host": 0, "from": "hosts"})
    assert 'from = "hosts" needs another host to cut host 0 off from: the layout has one' in alone
    alone = problems({"kind": "host-crash", "host": 0})
    assert 'host-crash entry 1: no hosts to hit: declare them in a [[faults]] entry of kind = "hosts"' in alone
    net = problems(LAYOUT, {"kind": "network", "toxic": "drop", "at": 1, "duration": 1})
    assert "network entry 2: a run with hosts has its workers' network in the hosts' namespaces" in net
    broker = problems(LAYOUT, {"kind": "broker-kill", "at": 1})
    assert "hosts entry 1: hosts do not combine with a broker fault (broker-kill)" in broker


def test_a_host_fault_is_planned_as_written() -> None:
    from crashbench import faults

    sc = on_hosts({"kind": "host-crash", "host": 1, "at": 0.4, "downtime": 0.2},
                  {"kind": "host-pause", "host": 0, "at": 0.1})  # fmt: skip
    pause, crash = faults.plan(sc)
    assert (crash.kind, crash.host, crash.at, crash.duration) == ("host-crash", 1, 0.4, 0.2)
    assert (pause.kind, pause.host, pause.at, pause.duration) == ("host-pause", 0, 0.1, hosts.DURATION)
    assert hosts.layout(sc) == ((0, 1), (2, 3))
    assert pause.apart == crash.apart == ()
    three = {"kind": "hosts", "slots": [[0], [1], [2, 3]]}
    cuts = [{"kind": "host-partition", "host": 1, "from": given} for given in ("server", "hosts", [2])]
    planned = faults.plan(on_hosts(*cuts).replace(schedule=(three, *cuts)))
    assert [f.apart for f in planned] == [(), (0, 2), (2,)]


def test_without_root_a_run_with_hosts_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = machine.unavailable()
    assert reason is not None and reason.startswith("hosts (a network and PID namespace each) cannot run here")
    assert "root" in reason and "\n" not in reason
    with pytest.raises(netns.NetnsError, match=r"hosts .* cannot run here"):
        run_designs(on_hosts(), ["reliable"], Options())


def test_hosts_refuse_a_server_crashbench_did_not_start(valkey_url: str) -> None:
    with pytest.raises(UsageError, match="hosts need a server crashbench starts"):
        run_designs(on_hosts(), ["reliable"], Options(redis_url=valkey_url))


# -- the PID namespace itself ------------------------------------------------------------------------


@needs_root
def test_killing_a_namespaces_init_kills_everything_in_it_and_nothing_forks_into_it_after(tmp_path: Path) -> None:
    init = pidns.Init.start(tmp_path / "init.log")
    r, w = os.pipe()
    pid = pidns.fork_into(init.ns)
    if pid == 0:  # inside: its own pid and its parent's, as it sees them; then it waits to be killed
        os.write(w, f"{os.getpid()} {os.getppid()}".encode())
        time.sleep(60)
        os._exit(0)
    os.close(w)
    assert os.read(r, 64).decode() == f"2 {pidns.OUTSIDE}"  # PID 1 is the init; its parent is outside
    os.close(r)
    assert sorted(pidns.members(init)) == sorted([init.pid, pid])
    init.kill()
    _, status = os.waitpid(pid, 0)  # no signal of ours: the kernel's, with the init
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert init.reap() and init.ns == -1
    fresh = pidns.Init.start(tmp_path / "init2.log")
    ns = os.dup(fresh.ns)
    fresh.kill()
    assert fresh.reap()
    with pytest.raises(pidns.PidnsError, match="init is gone"):
        pidns.fork_into(ns)
    os.close(ns)
    assert os.stat("/proc/self/ns/pid_for_children").st_ino == os.stat("/proc/self/ns/pid").st_ino
    assert leftovers() == []


@needs_root
def test_a_sigkilled_runner_leaves_no_host_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The init dies with its parent (PR_SET_PDEATHSIG), and everything on the host with it. The init is
    made slow to ask for that (0.3 s): Init.start waits until it has, so the runner cannot be killed in
    between (a CI run's was, under load, and its init lived on)."""
    real = pidns.die_with_parent

    def slow() -> None:
        time.sleep(0.3)
        real()

    monkeypatch.setattr(pidns, "die_with_parent", slow)
    r, w = os.pipe()
    runner = os.fork()
    if runner == 0:
        try:
            init = pidns.Init.start(tmp_path / "init.log")
            worker = pidns.fork_into(init.ns)
            if worker == 0:
                time.sleep(60)
                os._exit(0)
            os.write(w, f"{init.pid} {worker}".encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    init_pid, worker_pid = map(int, os.read(r, 64).split())
    os.close(r)
    os.kill(runner, signal.SIGKILL)
    os.waitpid(runner, 0)
    assert gone([init_pid, worker_pid]) == []


def gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The pids still running after `timeout` s. An orphan handed to this process (a subreaper, once a run
    made it one) is reaped here: the worker's zombie first, which its init's exit waits for."""
    deadline, left = time.monotonic() + timeout, list(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    left.remove(pid)
            except psutil.NoSuchProcess:
                left.remove(pid)
        time.sleep(0.01)
    return left


# -- runs --------------------------------------------------------------------------------------------


@needs_root
@pytest.mark.slow
def test_a_host_crash_kills_its_workers_at_once_and_naive_loses_what_they_ran(tmp_path: Path) -> None:
    # 250 ms jobs: at the crash each worker is almost surely inside one, however loaded the machine (with
    # 25 ms jobs a CI run's workers on the crashed host were between jobs, and nothing was interrupted).
    crash = {"kind": "host-crash", "host": 0, "at": 0.4, "downtime": 0.3}
    run, tl = run_one(on_hosts(crash, jobs=24, job_ms=250), "naive", tmp_path)
    (c,) = events(tl, "crash")
    (boot,) = events(tl, "boot")
    killed = set(c.data["workers"])
    on_host = {s.worker for s in tl.spawns if s.slot in (0, 1) and s.t <= c.t}
    assert killed == on_host and len(killed) == 2  # both of host 0's workers, none of host 1's
    # The ledger on its own: the jobs open in the killed workers at the end are those the crash interrupted.
    open_in = {ex.job for ex in tl.executions if ex.worker in killed and ex.end is None}
    assert set(c.data["jobs"]) == open_in and open_in
    assert boot.t >= c.t + 0.3 and all(
        s.slot in (0, 1) and s.t >= boot.t for s in tl.spawns if s.worker in boot.data["workers"]
    )
    assert events(tl, "ready") and events(tl, "ready")[0].t >= boot.t
    k = run.counts
    assert (k.host_crashes, k.host_crash_workers, k.host_crash_interrupted) == (1, 2, len(open_in))
    assert k.host_crash_lost == len(open_in) and k.host_crash_rerun == 0  # naive pops and forgets
    # Lost besides: what a killed worker had popped and not yet started (a CI run's second worker was
    # there), one job at most per killed worker the ledger shows inside none; nothing else is lost.
    started = {ex.job for ex in tl.executions}
    popped = set(run.jobs["lost"]) - open_in
    assert open_in <= set(run.jobs["lost"]) and not popped & started and len(popped) <= 2 - len(open_in)
    assert k.lost == len(open_in) + len(popped)


@needs_root
@pytest.mark.slow
def test_a_host_crash_under_reliable_runs_every_interrupted_job_again() -> None:
    crash = {"kind": "host-crash", "host": 1, "at": 0.4, "downtime": 0.2}
    run, tl = run_one(on_hosts(crash, jobs=24, job_ms=250), "reliable")
    (c,) = events(tl, "crash")
    interrupted = set(c.data["jobs"])
    again = {ex.job for ex in tl.executions if ex.job in interrupted and ex.start > c.t}
    k = run.counts
    assert interrupted and again == interrupted and k.host_crash_rerun == len(interrupted)
    assert k.host_crash_lost == k.lost == 0 and k.done == 24


@needs_root
@pytest.mark.slow
def test_a_paused_host_starts_nothing_until_it_resumes() -> None:
    pause = {"kind": "host-pause", "host": 0, "at": 0.3, "duration": 0.5}
    run, tl = run_one(on_hosts(pause, stale_after=5.0), "reliable")
    (p,) = events(tl, "pause")
    (resume,) = events(tl, "resume")
    slot_of = tl.slot_of()
    assert p.data["processes"] >= 3  # its init and its two workers
    frozen = p.data["frozen_at"]  # every process on it stopped, as the kernel reported
    during = [ex for ex in tl.executions if slot_of[ex.worker] in (0, 1) and frozen < ex.start < resume.t]
    assert during == []
    elsewhere = [ex for ex in tl.executions if slot_of[ex.worker] in (2, 3) and p.t < ex.start < resume.t]
    assert elsewhere  # host 1 went on
    assert run.counts.host_pauses == 1 and run.counts.lost == 0 and run.counts.done == 160


@needs_root
@pytest.mark.slow
def test_a_partitioned_host_reconnects_after_the_heal_and_leaves_no_rule() -> None:
    cut = {"kind": "host-partition", "host": 1, "at": 0.3, "duration": 0.6}
    run, tl = run_one(on_hosts(cut), "reliable")
    (p,) = events(tl, "partition")
    (heal,) = events(tl, "heal")
    slot_of = tl.slot_of()
    ended = [ex for ex in tl.executions if slot_of[ex.worker] in (2, 3) and ex.end is not None and ex.end > heal.t]
    assert ended  # its workers worked again after the heal
    assert heal.t >= p.t + 0.6 and run.counts.host_partitions == 1
    assert run.counts.lost == 0 and run.counts.done == 160


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("name", ["host-crash", "host-pause", "host-partition"])
def test_a_shipped_host_scenario_meets_its_own_exact_expectations_and_each_can_fail(name: str, tmp_path: Path) -> None:
    """Run as shipped (what `make scenarios` does, where namespaces can be made): every [expect.*] of the
    scenario met by every design it lists, each expectation failed by its figure moved past its bound,
    every count recounted from the saved timeline, nothing left behind."""
    sc = scenario.load(name)
    result = run_designs(sc, list(sc.run.designs), Options(), kind="check")
    unmet = [
        f"{t.design}: {t.threshold} (got {t.actual}, expected {t.expected})" for t in result.thresholds if not t.met
    ]
    assert unmet == [] and result.problems == [] and result.status == "pass", unmet
    assert [r.design for r in result.runs] == list(sc.run.designs) and all(d in sc.expect for d in sc.run.designs)
    assert failing(sc, result.runs) == []
    assert_each_can_fail(sc, result.runs)
    assert_recounts(result, tmp_path)
    assert leftovers() == []


# A listener in a namespace (on its address, any port: the port printed), and a connect from one that
# says how it went: "ok", "timeout" (its SYNs dropped) or the error.
LISTEN = """import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""
CONNECT = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(type(exc).__name__)
"""


def connect(ns: str, address: str, port: int, timeout: float) -> str:
    said = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, address, str(port), str(timeout)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return said.stdout.strip() or said.stderr.strip()


@needs_root
def test_a_partition_between_hosts_drops_their_packets_both_ways_and_each_still_reaches_the_server(
    valkey_url: str, tmp_path: Path
) -> None:
    """Three hosts routed through the machine; host 0 cut off from host 1 (`from = [1]`): a TCP connect
    either way between them gets no answer, and after the heal it does; host 2 still reaches host 0, and
    every host the server. A cut of host 1 from the server, healed meanwhile, leaves theirs in place."""
    hosts_ = machine.Hosts([[0], [1], [2]], valkey_url, tmp_path)
    net, server_port = hosts_.net, int(urlsplit(valkey_url).port or 0)
    command = [sys.executable, "-c", LISTEN]
    listen = [[*NS_EXEC, net.namespace(h), *command, net.worker_address(h)] for h in range(3)]
    listeners = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for args in listen]
    try:
        ports = [int(p.stdout.readline()) for p in listeners if p.stdout is not None]

        def reach(a: int, b: int, timeout: float = 10.0) -> str:  # a success comes at once: no wait
            return connect(net.namespace(a), net.worker_address(b), ports[b], timeout)

        def server(a: int) -> str:
            return connect(net.namespace(a), net.host_address(a), server_port, 10.0)

        assert [reach(0, 1), reach(1, 0), reach(2, 0), reach(0, 2)] == ["ok"] * 4  # through the machine
        hosts_.hosts[0].cut([1])
        assert [reach(0, 1, 1.0), reach(1, 0, 1.0)] == ["timeout", "timeout"]  # dropped, both ways
        assert [reach(2, 0), reach(0, 2), reach(1, 2), server(0), server(1), server(2)] == ["ok"] * 6
        hosts_.hosts[1].cut()  # from the server, then healed: host 0's cut from it stays
        assert connect(net.namespace(1), net.host_address(1), server_port, 1.0) == "timeout"
        hosts_.hosts[1].heal()
        assert [server(1), reach(1, 0, 1.0)] == ["ok", "timeout"]
        hosts_.hosts[0].heal()
        assert [reach(0, 1), reach(1, 0)] == ["ok", "ok"]
        inside = [subprocess.run([*NS_EXEC, net.namespace(h), "iptables", "-S", "INPUT"], capture_output=True,
                                 text=True).stdout.split() for h in range(3)]  # fmt: skip
        assert inside == [["-P", "INPUT", "ACCEPT"]] * 3  # every rule of the cuts deleted
    finally:
        for p in listeners:
            p.kill()
            p.wait()
        hosts_.close()
    assert leftovers() == []


@needs_root
@pytest.mark.slow
def test_a_partition_between_hosts_costs_reliable_nothing() -> None:
    """Workers talk to the server alone: host 0 cut off from host 1 for 0.6 s, its workers go on taking
    and finishing jobs meanwhile, and nothing is lost, given back or run twice."""
    cut = {"kind": "host-partition", "host": 0, "at": 0.3, "duration": 0.6, "from": "hosts"}
    run, tl = run_one(on_hosts(cut), "reliable")
    (p,) = events(tl, "partition")
    (heal,) = events(tl, "heal")
    assert p.data["apart"] == [1] and heal.t >= p.t + 0.6
    slot_of = tl.slot_of()
    during = [ex for ex in tl.executions if slot_of[ex.worker] in (0, 1) and p.t < ex.start and ex.end is not None
              and ex.end < heal.t]  # fmt: skip
    assert during  # host 0 still reached the server
    k = run.counts
    assert k.host_partitions == 1 and (k.lost, k.redelivered, k.duplicated) == (0, 0, 0) and k.done == 160


def test_the_host_crash_table_is_what_its_result_files_give() -> None:
    """docs/how-to/hosts.md's table is lab/hosts_table.py's on results/readme/hosts (make hosts)."""
    root = Path(__file__).resolve().parent.parent
    table = subprocess.run(
        [sys.executable, str(root / "lab" / "hosts_table.py"), str(root / "results" / "readme" / "hosts")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert all(f"\n| {design} | 3 |" in table for design in ("naive", "reliable", "stream"))
    assert table in (root / "docs" / "how-to" / "hosts.md").read_text()


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["host-crash", "host-pause", "host-partition"])
def test_a_run_interrupted_while_a_host_is_down_paused_or_cut_off_leaves_nothing_behind(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (the stop flag) the moment the fault is made: the run ends with Interrupted, and every
    worker, init, namespace and rule of its hosts is gone (a down host's dead init too, a paused one's)."""
    stop = StopFlag()
    made = []
    for name in ("crash", "cut", "pause"):
        real = getattr(machine.NamespaceHost, name)

        def hit(self: machine.NamespaceHost, *args: Any, real: Any = real) -> Any:
            out = real(self, *args)
            made.append(self.index)
            stop.raised = True
            return out

        monkeypatch.setattr(machine.NamespaceHost, name, hit)
    fault = {"kind": kind, "host": 1, "at": 0.2, ("downtime" if kind == "host-crash" else "duration"): 30}
    with pytest.raises(Interrupted):
        run_designs(on_hosts(fault), ["reliable"], Options(stop=stop))
    assert made and made[0] == 1
    assert leftovers() == []


@needs_root
@pytest.mark.slow
def test_a_hosts_workers_run_in_its_pid_namespace_and_a_slot_on_no_host_on_the_machine() -> None:
    """The ledger's pid is the worker's own, as it sees it: inside a host's PID namespace a small one (its
    init is 1), not the pid the runner forked; slot 3, on no host, writes the pid it was forked with."""
    sc = on_hosts(workers=4).replace(schedule=({"kind": "hosts", "slots": [[0, 1], [2]]},))
    run, tl = run_one(sc, "reliable")
    forked = {s.worker: (s.slot, s.pid) for s in tl.spawns}
    seen = {ex.worker: ex.pid for ex in tl.executions}
    assert {forked[w][0] for w in seen} == {0, 1, 2, 3}  # every slot ran jobs
    for worker, pid in seen.items():
        slot, outside = forked[worker]
        assert (pid == outside) == (slot == 3), (worker, slot, pid, outside)
        assert slot == 3 or pid < 10  # the init is 1, the workers forked into it next
    assert run.counts.lost == 0 and run.counts.done == 160


@needs_root
def test_a_worker_cannot_start_on_a_host_that_is_down(valkey_url: str, tmp_path: Path) -> None:
    hosts_ = machine.Hosts([[0, 1], [2]], valkey_url, tmp_path)
    try:
        assert hosts_.place(3) is None and hosts_.worker_url(valkey_url, 3) is None  # on no host
        assert hosts_.place(0) == hosts_.place(1) != hosts_.place(2)
        hosts_.hosts[0].crash()
        with pytest.raises(machine.HostDown, match="host 0, which is down"):
            hosts_.place(1)
        assert hosts_.hosts[0].reap(5.0)  # the dead init: nothing else was on it
        hosts_.hosts[0].boot()
        assert hosts_.place(1) is not None and hosts_.hosts[0].boots == 2
    finally:
        hosts_.close()
    assert leftovers() == []


@needs_root
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("rq") is None, reason="rq is not installed")
def test_a_child_kill_on_a_host_hits_the_work_horse_by_its_pid_on_the_host_and_the_worker_lives_on() -> None:
    """RQ runs each job in a forked work horse. A worker on a host records the horse's pid in its PID
    namespace (a small one); the harness finds the horse by it (pidns.own_pid) among the worker's
    children, whose pids here are others, and kills the horse alone: RQ's worker lives on and moves the
    job to its failed registry. Comparing the ledger's pid with the pids here found no horse, and the
    kill took the whole worker (target "worker", a replacement spawned)."""
    sc = on_hosts(jobs=200, job_ms=20, drain_timeout=10).replace(kills=3, interval=0.15, kill_target="child")
    run, tl = run_one(sc, "rq")
    assert [(k.target, k.mid_job, k.replacement) for k in run.kills] == [("child", True, None)] * 3
    assert len(tl.spawns) == 4  # no worker died: none was replaced
    for k in run.kills:
        (ex,) = [ex for ex in tl.executions if ex.job == k.job and ex.worker == k.worker]
        assert k.child == ex.pid and ex.end is None  # the horse the ledger names, killed inside the job
    c = run.counts
    assert c.failed == 3 and set(run.jobs["failed"]) == {k.job for k in run.kills}
    assert (c.lost, c.stranded, c.duplicated) == (0, 0, 0) and c.done == c.enqueued - 3


@needs_root
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("rq") is None, reason="rq is not installed")
def test_a_crash_job_whose_work_horse_died_on_a_host_does_not_keep_its_worker_busy() -> None:
    """Crash jobs (workload.crash_rate) kill RQ's work horse, and the worker, alive, moves on. The drain
    asks whether a live worker is inside a handler, a dead horse's open execution aside: on a host the
    ledger names the horse by its pid in the host's namespace, which looked up here was some other
    process, alive, so the worker looked busy for good and the run ended undrained, at its window."""
    sc = on_hosts(jobs=60, job_ms=20, drain_timeout=3).replace(crash_rate=0.05)
    run, tl = run_one(sc, "rq")
    c = run.counts
    crashed = {ex.job for ex in tl.executions if ex.end is None}
    assert c.crash_jobs == len(crashed) > 0 and set(run.jobs["failed"]) == crashed  # RQ fails each, once
    assert c.undrained == 0 and c.done == 60 - c.crash_jobs and c.worker_crashes == 0
