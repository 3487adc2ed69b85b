"""Scenario files: defaults, validation that reports every problem, overrides, the seeded schedule."""

from __future__ import annotations

import math
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.errors import ScenarioError, UsageError
from crashbench.faults import Fault, plan
from crashbench.model.faults import SignalFault
from crashbench.run.session import sweep_values
from crashbench.scenario import files as scenario_files
from crashbench.scenario import with_overrides
from tests.test_cli import crashbench_here

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_scenario_is_valid() -> None:
    paths = sorted((ROOT / "scenarios").glob("*.toml"))
    assert paths
    for path in paths:
        assert scenario.load(str(path)).source == str(path)


def test_default_scenario_is_the_lessons_crash_test() -> None:
    sc = scenario.load("default")
    w, f = sc.workload, sc.faults
    assert (w.jobs, w.job_ms, w.workers, f.kills, f.interval, f.signal) == (2000, 10, 4, 5, 0.5, "SIGKILL")
    assert sc.faults.kill_when == "mid-job"
    assert sc.ideal_s == pytest.approx(5.0)
    assert {"lost == 0", "stranded == 0", "done == enqueued"} <= {t.rule() for t in sc.expect["reliable"]}


def test_validation_lists_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        """
[workload]
jobs = -1
workrs = 4
[faults]
signal = "SIGBOGUS"
kill_when = "sometimes"
[expect.reliable]
lost = "about zero"
missing = 0
[extras]
"""
    )
    with pytest.raises(ScenarioError) as info:
        scenario.load(str(bad))
    text = info.value.message
    for fragment in ("workload.jobs", "workload.workrs", "SIGBOGUS", "kill_when", "about zero", "'missing'", "extras"):
        assert fragment in text
    assert len(info.value.problems) == 7


def test_not_toml_is_a_clear_problem(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text("[workload\njobs = ")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        scenario.load(str(bad))


def test_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(ScenarioError, match=r"known: .*default"):
        scenario.load("no-such-scenario")


def test_overrides_replace_and_are_validated() -> None:
    sc = with_overrides(scenario.load("default"), kills=2, signal="term", jobs=None)
    assert (sc.faults.kills, sc.faults.signal, sc.workload.jobs) == (2, "SIGTERM", 2000)
    with pytest.raises(ScenarioError, match=r"workload\.workers"):
        with_overrides(sc, workers=0)


def test_scenario_expectations_are_thresholds_and_bad_ones_are_listed(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[expect.naive]\nlost = "== kills_mid_job"\n[expect.reliable]\nlost = 0\nrecovery_p95 = "< 2s"\n')
    sc = scenario.load(str(good))
    assert [t.rule() for t in sc.expect["reliable"]] == ["lost == 0", "recovery_p95 < 2000ms"]
    assert sc.expect["naive"][0].ref == "kills_mid_job"
    assert scenario.Scenario.from_dict(sc.to_dict()).expect == sc.expect
    bad = tmp_path / "bad.toml"
    bad.write_text('[expect.reliable]\nlots = 0\nlost = true\nwall = "< 3 parsecs"\n')
    with pytest.raises(ScenarioError) as err:
        scenario.load(str(bad))
    text = str(err.value.message)
    assert "unknown metric 'lots'" in text and "lost = True" in text and "parsecs" in text


def test_same_seed_same_schedule_other_seed_other_victims() -> None:
    sc = scenario.Scenario.of(kills=20, workers=4)
    assert plan(sc) == plan(sc)
    other = plan(with_overrides(sc, seed=2))
    assert [k.slot for k in other] != [k.slot for k in plan(sc)]
    assert [k.at for k in plan(sc)][:3] == [0.5, 1.0, 1.5]


def test_sweep_values_follow_the_settings_declared_type() -> None:
    sc = scenario.Scenario.of(heartbeat_every=0)  # as a TOML file may write it
    values = sweep_values(sc, "heartbeat_every", "0, 0.1")
    assert [v.queue.heartbeat_every for v in values] == [0.0, 0.1]
    assert [v.faults.kills for v in sweep_values(sc, "kills", "1,3")] == [1, 3]
    with pytest.raises(UsageError, match="not a whole number"):
        sweep_values(sc, "kills", "1.5")


def test_library_tables_pass_through_to_the_design_settings(tmp_path: Path) -> None:
    path = tmp_path / "lib.toml"
    path.write_text('[library."celery:acks-late"]\nworker_prefetch_multiplier = 2\n[library.rq]\nworker_ttl = 30\n')
    sc = scenario.load(str(path))
    assert sc.settings("celery:acks-late").options == {"worker_prefetch_multiplier": 2}
    assert sc.settings("rq").options == {"worker_ttl": 30}
    assert sc.settings("reliable").options == {}
    path.write_text("[library]\nrq = 3\n")
    with pytest.raises(ScenarioError, match="one table per design"):
        scenario.load(str(path))


# --- Safe on any input: every field checked by type, nan and inf refused, unreadable files named ---


def crashbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m crashbench ARGS` in `cwd`, run in this process: every call here starts nothing."""
    return crashbench_here(*args, tmp_path=cwd, cwd=cwd)


def problems_of(tmp_path: Path, text: str | bytes) -> list[str]:
    path = tmp_path / "s.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        scenario.load(str(path))
    return info.value.problems


def test_a_value_of_the_wrong_type_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path,
        '[broker]\nfault_at = "soon"\nreplica_lag = "1"\n[faults]\nkills = true\ninterval = "0.5"\nsignal = 1.5\n'
        '[queue]\nmax_attempts = 2.5\n[run]\ndesigns = "naive"\n',
    )
    assert len(found) == 7, found
    for fragment in ("broker.fault_at", "broker.replica_lag", "faults.kills", "faults.interval", "faults.signal",
                     "queue.max_attempts", "run.designs"):  # fmt: skip
        assert any(p.startswith(fragment) for p in found), (fragment, found)
    cp = crashbench("run", "--scenario", str(tmp_path / "s.toml"), "--server", "/nonexistent", cwd=tmp_path)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr and "7 problem(s)" in cp.stderr, cp.stderr
    assert "  - broker.fault_at must be a number >= 0, not 'soon'\n" in cp.stderr  # one line per problem
    assert problems_of(tmp_path, "workload = 3\nname = 4\n") == ["[workload] must be a table", "name must be a string"]
    found = problems_of(tmp_path, "[workload]\njobs = -5\nworkers = 0\n[faults]\nkills = -1\n[broker]\nwait_ms = 1e3\n")
    assert [p.split()[0] for p in found] == ["workload.jobs", "workload.workers", "faults.kills", "broker.wait_ms"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+inf"])
def test_nan_and_infinity_in_a_scenario_file_are_refused(tmp_path: Path, value: str) -> None:
    text = (
        f"[workload]\njob_ms = {value}\npoison_rate = {value}\n[faults]\ninterval = {value}\n"
        f"[queue]\nstale_after = {value}\nretry_factor = {value}\n[broker]\nfault_at = {value}\n"
        f"[run]\ndrain_timeout = {value}\n[expect.naive]\nlost = {value}\n[library.rq]\nworker_ttl = [{value}]\n"
    )
    found = problems_of(tmp_path, text)
    fragments = ["workload.job_ms", "workload.poison_rate", "faults.interval", "queue.stale_after",
                 "queue.retry_factor", "broker.fault_at", "run.drain_timeout", "[expect.naive]",
                 "[library.rq]"]  # fmt: skip
    for fragment in fragments:
        assert any(p.startswith(fragment) for p in found), (fragment, found)


def test_huge_numbers_are_refused_with_a_short_message(tmp_path: Path) -> None:
    found = problems_of(tmp_path, f"[workload]\njobs = {2**63}\n[expect.naive]\nlost = {'9' * 400}\n")
    assert found[0].startswith("[expect.naive]") and "too large" in found[0] and len(found[0]) < 200
    assert found[1].startswith("workload.jobs is too large")
    assert "4300 digits" in problems_of(tmp_path, "a = " + "9" * 5000)[0]
    assert "nested too deeply" in problems_of(tmp_path, "a = " + "[" * 5000)[0]


def test_a_file_that_is_not_utf8_is_a_clean_error(tmp_path: Path) -> None:
    (found,) = problems_of(tmp_path, "[workload]\n# caf\xe9\njobs = 3\n".encode("latin-1"))
    assert found.startswith("not UTF-8 text (byte 0xe9")
    assert scenario.load(str(_write(tmp_path / "bom.toml", b"\xef\xbb\xbf[workload]\njobs = 3\n"))).workload.jobs == 3
    # `list` in a directory whose ./scenarios holds one: it shows as invalid, the others still listed
    _write(tmp_path / "scenarios" / "bad.toml", b"name = '\xff'\n")
    cp = crashbench("list", cwd=tmp_path)
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr
    assert "invalid: " in cp.stdout and "bad" in cp.stdout and "default" in cp.stdout
    cp = crashbench("run", "--scenario", "bad", cwd=tmp_path)
    assert cp.returncode == 2 and "not UTF-8" in cp.stderr and "Traceback" not in cp.stderr


def _write(path: Path, raw: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


def test_every_numeric_override_refuses_nan_and_infinity() -> None:
    sc = scenario.Scenario()
    for name, bound in scenario.NUMBERS.items():
        bad = [math.nan, math.inf, -math.inf, True, "1", 2**64] + ([1.5] if bound.whole else [])
        for value in bad:
            with pytest.raises(ScenarioError, match=rf"\.{name} "):
                with_overrides(sc, **{name: value})


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--interval", "inf"],
        ["run", "--job-ms", "nan"],
        ["compare", "--stale-after", "NaN"],
        ["check", "--drain-timeout", "-inf"],
        ["sweep", "-p", "interval=0.5,inf"],
        ["bench", "--job-ms", "nan"],
    ],
)
def test_nan_and_infinity_on_the_command_line_exit_2(args: list[str], tmp_path: Path) -> None:
    # --server points nowhere: had anything started, the error would be exit 3, not 2
    cp = crashbench(*args, "--server", "/nonexistent/redis-server", cwd=tmp_path)
    assert cp.returncode == 2, cp.stderr + cp.stdout
    assert "Traceback" not in cp.stderr and ("finite" in cp.stderr or "must be a number" in cp.stderr), cp.stderr


def test_packaged_scenarios_are_found_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shipped = scenario_files.packaged_dir()
    assert shipped is not None and (shipped / "default.toml").is_file()
    assert scenario.load("default").source == str(shipped / "default.toml")
    assert "default" in {p.stem for p in scenario.available()}
    # ./scenarios is looked up first: a project's own scenario of the same name wins
    _write(tmp_path / "scenarios" / "default.toml", b'name = "mine"\n')
    assert scenario.load("default").name == "mine"
    assert [p for p in scenario.available() if p.stem == "default"] == [Path.cwd() / "scenarios" / "default.toml"]


def test_square_brackets_in_an_error_are_printed_as_written(tmp_path: Path) -> None:
    """User text in a message is not rich markup: "[workload] must be a table" keeps its brackets, in
    a scenario's problems and in a threshold's error alike."""
    bad = _write(tmp_path / "bad.toml", b"workload = 3\n")
    cp = crashbench("run", "--scenario", str(bad), cwd=tmp_path)
    assert cp.returncode == 2 and "[workload] must be a table" in cp.stderr, cp.stderr
    cp = crashbench("run", "-t", "[x]: lost=0", cwd=tmp_path)
    assert cp.returncode == 2 and "[x]" in cp.stderr, cp.stderr


MIXED = """
name = "mixed"
[workload]
workers = 3
[[faults]]
signal = "term"
at = 0.4
count = 3
every = 0.3
[[faults]]
kind = "broker-kill"
at = 0.9
downtime = 0.4
[[faults]]
signal = "SIGSTOP"
slot = 2
at = 1.0
pause = 0.5
"""


def test_a_faults_array_plans_a_mixed_schedule_in_order_of_start() -> None:
    sc = scenario.parse(tomllib.loads(MIXED), "mixed.toml")
    assert (sc.faults.kills, sc.broker.fault, sc.broker.fault_at, sc.broker.downtime) == (0, "broker-kill", 0.9, 0.4)
    faults = plan(sc)
    assert [(f.at, f.kind, getattr(f, "signal", None)) for f in faults] == [
        (0.4, "signal", "SIGTERM"), (0.7, "signal", "SIGTERM"), (0.9, "broker-kill", None),
        (1.0, "signal", "SIGTERM"), (1.0, "signal", "SIGSTOP"),
    ]  # fmt: skip
    assert faults[2] == Fault(2, 0.9, "broker-kill", duration=0.4) and faults[2].end == 1.3
    assert faults[4].slot == 2 and faults[4].end == 1.5  # a pause ends; a kill has no end
    assert faults[0].end is None and all(0 <= f.slot < 3 for f in faults if f.on_worker)
    assert plan(sc) == faults  # seeded
    # The command line adds a periodic group: it draws its slots first, the entries keep their times.
    more = plan(with_overrides(sc, kills=2, interval=0.25))
    signals = [f for f in more if isinstance(f, SignalFault)]
    assert [f.at for f in signals if f.signal == "SIGKILL"] == [0.25, 0.5]
    assert sorted(f.at for f in signals if f.signal == "SIGTERM") == [0.4, 0.7, 1.0]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            'kind = "meteor"',
            "kind must be signal, network, broker-kill, failover, cluster-kill, cluster-failover, "
            "cluster-failover-force, cluster-takeover, cluster-partition, deploy, migrate, eviction, sentinel-kill, "
            "sentinel-quorum, sentinel-partition, power-loss, clock, hosts, host-crash, host-pause, "
            "host-partition, not 'meteor'",
        ),
        ('kind = "network"\ntoxic = "gremlins"', "toxic must be one of latency, bandwidth, slicer"),
        ('kind = "network"\ntoxic = "latency"\ndirection = "sideways"', "direction must be one of upstream"),
        ('kind = "network"\ntoxic = "down"\nslot = 0\nworkers = 2', "give slot or workers, not both"),
        ('kind = "network"\ntoxic = "latency"\nlatency = -5', "latency must be a number from 0"),
        ('kind = "network"\ntoxic = "down"\nsignal = "SIGKILL"', "unknown key 'signal' for network"),
        ("slot = 3", "slot must be a worker slot, 0 to 2, not 3"),
        ("count = 1.5", "count must be a whole number"),
        ("every = -1", "every must be at least 0"),
        ('signal = "SIGNOPE"', "signal must be one of"),
        ('kill_when = "later"', "kill_when must be mid-job or any"),
        ('after = "lunch"\nkill_when = "any"', "after must be start or drained, not 'lunch'"),
        ('after = "drained"', 'after = "drained" needs kill_when = "any"'),
        ("downtime = 1", "unknown key 'downtime'"),
    ],
)
def test_a_faults_entry_that_cannot_run_is_a_scenario_problem(entry: str, problem: str) -> None:
    text = f"[workload]\nworkers = 3\n[[faults]]\n{entry}\n"
    with pytest.raises(ScenarioError, match=re.escape(problem)):
        scenario.parse(tomllib.loads(text), "bad.toml")


def test_faults_timed_from_the_drain_come_after_every_other_fault(tmp_path: Path) -> None:
    text = (
        '[workload]\nworkers = 3\n[[faults]]\nat = 0.1\ncount = 2\nkill_when = "any"\nafter = "drained"\n'
        "[[faults]]\nat = 1.0\n"
    )
    faults = plan(scenario.parse(tomllib.loads(text), "drained.toml"))
    assert [(f.index, f.at, f.after) for f in faults] == [(0, 1.0, "start"), (1, 0.1, "drained"), (2, 0.6, "drained")]
    # On the command line, before anything starts: exit 2, the entry's problem, no traceback.
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('kill_when = "any"\n', ""))
    cp = crashbench_here("run", "--scenario", str(bad), tmp_path=tmp_path)
    assert cp.returncode == 2 and 'after = "drained" needs kill_when = "any"' in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr


def test_a_network_entry_plans_its_toxic_on_its_slots() -> None:
    text = (
        '[workload]\nworkers = 4\n[[faults]]\nkind = "network"\ntoxic = "latency"\nlatency = 200\njitter = 50\n'
        'at = 1.0\nduration = 2.0\nworkers = 2\n[[faults]]\nkind = "network"\ntoxic = "timeout"\nslot = 3\n'
        '[[faults]]\nkind = "network"\ntoxic = "reset_peer"\ndirection = "downstream"\nat = 4\n'
    )
    sc = scenario.parse(tomllib.loads(text), "net.toml")
    timeout, latency, reset = (f for f in plan(sc) if f.kind == "network")  # by start
    assert latency.toxic == {"name": "latency", "direction": "both", "latency": 200, "jitter": 50}
    assert (latency.at, latency.end, len(latency.slots)) == (1.0, 3.0, 2) and set(latency.slots) <= {0, 1, 2, 3}
    assert (timeout.at, timeout.end, timeout.slots) == (0.5, None, (3,))  # no duration: it never heals
    assert reset.slots == (0, 1, 2, 3) and reset.toxic["direction"] == "downstream"  # neither: every worker
    assert plan(sc) == plan(sc)  # seeded


def test_a_run_has_at_most_one_broker_fault() -> None:
    text = '[[faults]]\nkind = "broker-kill"\n[[faults]]\nkind = "failover"\n'
    with pytest.raises(ScenarioError, match="at most one broker fault"):
        scenario.parse(tomllib.loads(text), "two.toml")


def test_the_network_option_is_a_faults_entry_from_the_command_line() -> None:
    from click.testing import CliRunner

    from crashbench.cli import cli
    from crashbench.faults import network_option

    entry = network_option("toxic=latency, latency=200,jitter=50.5,at=1,duration=2,direction=upstream")
    assert entry == {"kind": "network", "toxic": "latency", "latency": 200, "jitter": 50.5, "at": 1,
                     "duration": 2, "direction": "upstream"}  # fmt: skip
    for bad, says in (("at=1", "name the toxic"), ("toxic=timeout,at", "'at' is not KEY=VALUE")):
        with pytest.raises(ValueError, match=re.escape(says)):
            network_option(bad)
    # Refused before anything starts: exit 2, the scenario's own check of the entry.
    out = CliRunner().invoke(cli, ["run", "--network", "toxic=latency,slot=9", "--plain"])
    assert out.exit_code == 2 and "slot must be a worker slot, 0 to 3, not 9" in out.output


def test_a_socket_timeout_within_the_workers_pop_is_refused() -> None:
    assert scenario.problems_of(scenario.Scenario.of(socket_timeout=0)) == []  # none: the hang, on purpose
    assert scenario.problems_of(scenario.Scenario.of(socket_timeout=0.5)) == []
    problems = scenario.problems_of(scenario.Scenario.of(socket_timeout=0.05))
    assert problems == ["queue.socket_timeout must be 0 (none) or longer than a worker's blocking pop (0.1 s)"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--interval", "1e9"], "faults.interval is 1000000000.0 s: a run's schedule is bounded to 86400 s"),
        (["--pause", "1e9"], "faults.pause is 1000000000.0 s"),
        (["--fault-at", "1e9", "--broker-fault", "kill"], "broker.fault_at is 1000000000.0 s"),
        (["--kills", "100000", "--interval", "1"], "faults.kills x faults.interval is 100000.0 s"),
        (["--jobs", str(2**62)], "workload.jobs 4,611,686,018,427,387,904 is more than crashbench holds"),
    ],
)
def test_absurd_but_finite_settings_are_refused_before_anything_runs(args: list[str], says: str) -> None:
    """Each hung a run (or enqueued until interrupted): exit 2 with the setting and its bound."""
    from click.testing import CliRunner

    from crashbench.cli import cli

    got = CliRunner().invoke(cli, ["run", "-d", "naive", *args, "--plain"])
    assert got.exit_code == 2 and says in got.output and "Traceback" not in got.output, got.output


def test_a_fault_time_in_a_scenario_file_and_a_huge_name_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "' + "n" * 1200 + '"\n[broker]\nfault = "kill"\nfault_at = 1e300\n')
    with pytest.raises(ScenarioError) as info:
        scenario.load(str(path))
    text = str(info.value.problems if hasattr(info.value, "problems") else info.value)
    assert "broker.fault_at is 1e+300 s" in text and "name is 1,200 characters long (at most 1,000)" in text


def test_clean_refuses_a_grace_that_is_not_a_number() -> None:
    from click.testing import CliRunner

    from crashbench.cli import cli

    got = CliRunner().invoke(cli, ["clean", "--redis-url", "redis://127.0.0.1:1/0", "--grace", "nan"])
    assert got.exit_code == 2 and "nan is not a number of seconds" in got.output


@pytest.mark.parametrize(
    ("table", "says"),
    [
        (
            'broker_url = "redis://elsewhere:6379/0"',
            "broker_url: a library is pointed at the run's server by crashbench",
        ),
        ('result_backend = "redis://elsewhere"', "result_backend: a library is pointed at the run's server"),
        ('broker_transport_options = { host = "elsewhere" }', "broker_transport_options.host: a library is pointed"),
        ('some_option = "redis://elsewhere"', "some_option = 'redis://elsewhere': a URL in a library's settings"),
        ("worker_concurrency = -1", "worker_concurrency must be at least 1, not -1"),
        ("worker_concurrency = 0", "worker_concurrency must be at least 1, not 0"),
        ("visibility_timeout = -5", "visibility_timeout must not be negative, not -5"),
    ],
)
def test_library_settings_never_point_elsewhere_and_stay_in_range(tmp_path: Path, table: str, says: str) -> None:
    """Celery's workers went to `broker_url` whatever the run's server was; -1 workers failed late."""
    path = tmp_path / "s.toml"
    path.write_text(f'[library."celery:acks-late"]\n{table}\n')
    with pytest.raises(ScenarioError) as info:
        scenario.load(str(path))
    assert says in str(info.value), str(info.value)


def test_library_settings_a_user_needs_are_still_taken(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        '[library."celery:acks-late"]\nbroker_transport_options = { visibility_timeout = 5 }\n'
        "worker_concurrency = 2\n[library.taskiq]\nsocket_timeout = 3600\n"
    )
    sc = scenario.load(str(path))
    assert sc.library["celery:acks-late"]["worker_concurrency"] == 2
