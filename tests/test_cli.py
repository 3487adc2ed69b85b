"""The command line as a user runs it: real processes, real servers, exit codes, one-screen errors.

A command that starts nothing (a usage error, --help, list) runs in this process through the same
entry point (`crashbench_here`): its exit code, stdout and stderr are those of `python -m crashbench`,
without the interpreter's start-up; tests/test_exit_codes.py still ends every exit category in a real
process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from crashbench.control import workdirs
from crashbench.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--jobs", "600", "--job-ms", "5", "--interval", "0.1", "--stale-after", "0.3", "--recover-every", "0.05"]


def crashbench(
    *args: str, tmp_path: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crashbench", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        check=False,
    )


def crashbench_here(
    *args: str, tmp_path: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """`crashbench ARGS` as `python -m crashbench` runs it (the same entry point, crashbench.cli.main,
    argv, environment, working directory, fresh consoles reading COLUMNS, an uncaught exception's
    traceback on stderr with exit 1), but inside this process: no interpreter start-up and imports
    (about 0.4 s a call, more under load). Only for commands that start nothing (no server, worker or
    run): usage errors, --help, list, and reading or gating saved results. Whatever a command changes
    of this process (signal dispositions, consoles, sys.path, cwd) is put back."""
    import traceback
    import types

    from click import formatting
    from click.testing import CliRunner
    from rich.console import Console

    from crashbench.cli import common, main

    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved = (sys.argv, sys.path[:], sys.modules["__main__"], common.out, common.err, Path.cwd())
    stand_in = types.ModuleType("__main__")
    stand_in.__package__ = "crashbench"  # so click names the program "python -m crashbench", as it runs
    runner = CliRunner()
    try:
        with runner.isolation(env={"COLUMNS": "200", **(env or {})}) as (stdout, stderr, _):
            formatting.FORCED_WIDTH = None  # the isolation's 80 columns: a real process reads COLUMNS
            common.out, common.err = Console(), Console(stderr=True)  # as importing crashbench.cli makes them
            sys.argv = [str(ROOT / "crashbench" / "__main__.py"), *args]
            sys.modules["__main__"] = stand_in
            os.chdir(cwd)
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # what Python prints for an uncaught exception, exit 1
                sys.stderr.write(traceback.format_exc())
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            out, err = stdout.getvalue().decode(), stderr.getvalue().decode()
    finally:
        sys.argv, sys.path[:], sys.modules["__main__"], common.out, common.err, cwd_before = saved
        os.chdir(cwd_before)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
    return subprocess.CompletedProcess(["crashbench", *args], code, out, err)


def assert_clean_error(cp: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert cp.returncode == code, cp.stderr + cp.stdout
    assert "Traceback" not in cp.stderr + cp.stdout
    assert len(cp.stderr.splitlines()) < 25  # one screen
    for fragment in fragments:
        assert fragment in cp.stderr


def test_run_json_is_the_typed_result_with_schema_and_environment(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cp = crashbench("run", "--design", "naive", "--kills", "2", *SMALL, "--json", "--out", str(out), tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert data == json.loads(out.read_text())
    assert (data["schema"], data["schema_version"]) == ("crashbench.result", 4)
    assert data["scenario"]["jobs"] == 600 and data["scenario"]["seed"] == 1
    run = data["runs"][0]
    assert run["counts"]["lost"] == run["counts"]["kills_mid_job"] == 2
    assert [k["mid_job"] for k in run["kills"]] == [True, True]
    assert {"at", "slot", "worker", "pid", "signal", "job", "replacement_ready_ms"} <= set(run["kills"][0])
    env = data["environment"]
    assert env["server_mode"] == "embedded" and env["server_version"] and env["redis_py"] and env["python"]
    assert [t["status"] for t in data["thresholds"]] == ["pass"] * len(data["thresholds"]) and data["thresholds"]
    assert data["status"] == "pass" and data["id"].endswith(data["runs"][0]["prefix"].split(":")[1].strip("{}"))


@pytest.mark.slow
def test_results_go_to_results_dir_by_default_and_table_is_printed(tmp_path: Path) -> None:
    # No --out: the result lands in ./results of the directory crashbench runs in.
    cp = crashbench("compare", "--designs", "naive,reliable", "--kills", "1", *SMALL, tmp_path=tmp_path, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "naive" in cp.stdout and "reliable" in cp.stdout and "lost" in cp.stdout
    files = list((tmp_path / "results").glob("*-compare-default-naive-reliable.json"))
    assert len(files) == 1 and str(files[0].relative_to(tmp_path)) in cp.stdout.replace("\n", "")


def test_failed_expectation_exits_1_and_is_marked(tmp_path: Path) -> None:
    sc = tmp_path / "strict.toml"
    sc.write_text('name = "strict"\n[faults]\nkills = 2\n[expect.naive]\nlost = 0\n')
    cp = crashbench("run", "-d", "naive", "--scenario", str(sc), *SMALL, "--out", str(tmp_path), tmp_path=tmp_path)
    assert cp.returncode == 1, cp.stderr
    assert "✗ naive: lost == 0 (got 2)" in cp.stdout


def test_bad_scenario_exits_2_listing_every_problem(tmp_path: Path) -> None:
    sc = tmp_path / "bad.toml"
    sc.write_text("[workload]\njobs = 0\n[faults]\ninterval = -1\n")
    cp = crashbench_here("run", "--scenario", str(sc), tmp_path=tmp_path)
    assert_clean_error(cp, 2, "2 problem(s)", "workload.jobs", "faults.interval")


def test_bad_fault_settings_are_refused_before_anything_starts(tmp_path: Path) -> None:
    # --server points nowhere: had anything started, the error would be exit 3, not 2.
    nowhere = ["--server", "/nonexistent/redis-server"]
    assert_clean_error(crashbench_here("run", "--signal", "SIGNOPE", *nowhere, tmp_path=tmp_path), 2, "faults.signal")
    assert_clean_error(crashbench_here("run", "--kill-when", "never", *nowhere, tmp_path=tmp_path), 2, "kill-when")
    assert_clean_error(crashbench_here("run", "--pause", "0", *nowhere, tmp_path=tmp_path), 2, "faults.pause")
    assert_clean_error(crashbench_here("run", "--pause", "-1", *nowhere, tmp_path=tmp_path), 2, "faults.pause")
    cp = crashbench_here("run", "--poison-rate", "1.5", "--transient-rate", "-0.1", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "workload.poison_rate", "workload.transient_rate")
    cp = crashbench_here("sweep", "--param", "colour=1,2", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "cannot sweep 'colour'", "stale_after")
    cp = crashbench_here("sweep", "--param", "stale_after=fast", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "not a number")
    cp = crashbench_here("sweep", "--param", "stale_after=0,1", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "queue.stale_after")


def test_a_threshold_naming_a_design_not_in_the_run_exits_2_before_anything_starts(tmp_path: Path) -> None:
    # --server points nowhere: had a server been started, the exit would be 3, not 2.
    nowhere = ["--server", "/nonexistent/redis-server"]
    cp = crashbench_here("run", "-d", "reliable", "-t", "relable: lost=0", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "--threshold 'relable: lost == 0'", "designs: reliable")
    cp = crashbench_here("compare", "--designs", "naive,reliable", "-t", "stream: lost=0", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "'stream: lost == 0'", "designs: naive, reliable")
    sc = tmp_path / "typo.toml"
    sc.write_text('name = "typo"\n[run]\ndesigns = ["reliable"]\n[expect.relable]\nlost = 0\n')
    cp = crashbench_here("run", "-d", "reliable", "--scenario", str(sc), *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "[expect.relable]", "designs: reliable")


def test_a_scenario_expectation_for_another_of_its_designs_is_not_a_typo(tmp_path: Path) -> None:
    # The default scenario's [expect.naive] is for one of its run.designs: running reliable alone gets
    # as far as starting the server (exit 3 here), not a usage error.
    cp = crashbench_here("run", "-d", "reliable", "--server", "/nonexistent/redis-server", tmp_path=tmp_path)
    assert_clean_error(cp, 3, "not found")


def test_unknown_design_exits_2_naming_the_known_ones(tmp_path: Path) -> None:
    assert_clean_error(
        crashbench_here("run", "--design", "nope", tmp_path=tmp_path), 2, "unknown design 'nope'", "naive"
    )
    assert_clean_error(crashbench_here("run", "--design", "no_such_pkg.mod:Q", tmp_path=tmp_path), 2, "cannot import")


def test_missing_server_binary_exits_3_with_the_fix(tmp_path: Path) -> None:
    cp = crashbench_here("run", "--server", "/nonexistent/redis-server", tmp_path=tmp_path)
    assert_clean_error(cp, 3, "not found", "hint")


def test_unreachable_server_exits_3(tmp_path: Path) -> None:
    cp = crashbench_here("run", "--redis-url", "redis://127.0.0.1:1/0", tmp_path=tmp_path)
    assert_clean_error(cp, 3, "cannot reach redis://127.0.0.1:1/0", "hint")


@pytest.mark.slow
def test_external_server_keeps_its_foreign_keys_and_loses_ours(valkey_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(valkey_url, decode_responses=True)
    client.set("app:user:1", "alice")
    client.rpush("app:jobs", "x", "y")
    client.set("crashbench:someone-else", "theirs")
    before = {k: client.type(k) for k in client.scan_iter()}
    cp = crashbench(
        "compare", "--kills", "2", *SMALL, "--redis-url", valkey_url, "--out", str(tmp_path), tmp_path=tmp_path
    )
    assert cp.returncode == 0, cp.stderr
    after = {k: client.type(k) for k in client.scan_iter()}
    assert after == before
    assert client.get("app:user:1") == "alice" and client.lrange("app:jobs", 0, -1) == ["x", "y"]
    assert client.get("crashbench:someone-else") == "theirs"
    client.delete("app:user:1", "app:jobs", "crashbench:someone-else")
    client.close()


def test_list_shows_designs_and_scenarios(tmp_path: Path) -> None:
    cp = crashbench_here("list", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    for name in ("naive", "reliable", "stream", "default"):
        assert name in cp.stdout


@pytest.mark.parametrize("command", ["run", "compare"])
def test_help_documents_every_option(command: str, tmp_path: Path) -> None:
    cp = crashbench_here(command, "--help", tmp_path=tmp_path)
    assert cp.returncode == 0
    for option in ("--scenario", "--jobs", "--job-ms", "--workers", "--kills", "--interval", "--signal", "--seed",
                   "--kill-when", "--redis-url", "--server", "--keep", "--out", "--json"):  # fmt: skip
        assert option in cp.stdout


def test_readme_documents_every_exit_code() -> None:
    readme = (ROOT / "README.md").read_text()
    for code in ExitCode:
        assert f"| {code.value} | `{code.name}` |" in readme


@pytest.mark.slow
def test_sweep_runs_one_design_per_value_and_labels_the_columns(tmp_path: Path) -> None:
    cp = crashbench(
        "sweep", "-d", "reliable", "-p", "kills=0,2", *SMALL, "--json", "--out", str(tmp_path), tmp_path=tmp_path
    )
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert data["kind"] == "sweep"
    assert [r["variant"] for r in data["runs"]] == ["kills=0", "kills=2"]
    assert [r["counts"]["kills"] for r in data["runs"]] == [0, 2]
    assert data["runs"][1]["timings"]["recovery_ms_max"] is not None


def test_an_out_path_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    # --server points nowhere: had the run started, the exit would be 3, not 2.
    nowhere = ["--server", "/nonexistent/redis-server"]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker / "results", blocker, tmp_path / "a-dir.json"):
        (tmp_path / "a-dir.json").mkdir(exist_ok=True)
        cp = crashbench_here("run", "--kills", "1", *nowhere, "--out", str(out), tmp_path=tmp_path)
        assert_clean_error(cp, 2, "--out")
    cp = crashbench_here("bench", *nowhere, "--out", str(blocker / "results"), tmp_path=tmp_path)
    assert_clean_error(cp, 2, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir.json", "a-file"]  # nothing made


def test_a_scenario_name_cannot_write_outside_out_nor_make_a_name_too_long(tmp_path: Path) -> None:
    sc = tmp_path / "evil.toml"
    sc.write_text(f'name = "../../{"x" * 300}/y z"\n')
    store = tmp_path / "store"
    cp = crashbench("run", "-d", "naive", "-s", str(sc), *SMALL, "--kills", "0", "--out", str(store), tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    (saved,) = [p for p in tmp_path.rglob("*.json")]
    assert saved.parent == store and len(saved.name) < 120
    assert set(saved.name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def test_keep_marks_its_directory_so_no_later_sweep_removes_it_and_paths_print_whole(tmp_path: Path) -> None:
    # 80 columns, as when output is not a terminal: a path longer than that is printed on one line.
    out = tmp_path / ("a-store-with-a-long-name-" * 3)
    cp = crashbench("run", "-d", "naive", *SMALL, "--kills", "1", "--keep", "--out", str(out), tmp_path=tmp_path,
                    env={"COLUMNS": "80"})  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    (saved,) = out.glob("*.json")
    workdir = Path(json.loads(saved.read_text())["runs"][0]["workdir"])
    try:
        lines = cp.stdout.splitlines()
        assert f"result: {saved}" in lines
        assert any(line.endswith(f"kept in {workdir}") for line in lines)
        assert (workdir / "KEPT").is_file()
        # crashbench has exited, so the directory's owner pid is gone: the sweep must leave it all the same
        assert workdir not in workdirs.remove_orphans() and workdir.is_dir()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_help_shows_baseline_examples_only_where_baseline_is_accepted_and_whole_summaries(tmp_path: Path) -> None:
    for command in ("run", "compare", "sweep"):
        assert "baseline" not in crashbench_here(command, "--help", tmp_path=tmp_path).stdout
    assert "jobs_per_s>=-10%" in crashbench_here("check", "--help", tmp_path=tmp_path).stdout.replace("\n", " ")
    listing = crashbench_here("--help", tmp_path=tmp_path).stdout
    assert "(e.g" not in listing


def test_list_shows_markup_in_names_descriptions_and_hints_as_the_text_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Words that come from files or libraries are data: `[rq]` in an install hint, a description with
    a terminal hyperlink, a scenario file named like a style are printed as written, never styled."""
    from click.testing import CliRunner

    from crashbench.cli import cli
    from crashbench.cli import crash as crash_cmd
    from crashbench.errors import UsageError

    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "[red]x[red].toml").write_text(
        'name = "evil"\ndescription = "see [link=https://example.invalid]here[/link] and [bold]this[/bold]"\n'
    )
    real = crash_cmd.load_design

    def load(name: str):  # type: ignore[no-untyped-def]
        if name == "rq":
            raise UsageError("rq is not installed", hint="pip install 'crashbench[rq]'")
        return real(name)

    monkeypatch.setattr(crash_cmd, "load_design", load)
    monkeypatch.chdir(tmp_path)
    got = CliRunner().invoke(cli, ["list"], env={"COLUMNS": "300"}, color=True)
    assert got.exit_code == 0, got.output
    assert "pip install 'crashbench[rq]'" in got.output
    assert "[link=https://example.invalid]here[/link]" in got.output and "\x1b]8;" not in got.output
    assert "[bold]this[/bold]" in got.output and "[red]x[red]" in got.output


def test_plain_output_off_a_terminal_cuts_no_header_label_or_id(tmp_path: Path) -> None:
    """In a CI log (not a terminal, 80 columns by default) a long design name was cut to
    `designs_consumer…`: the installed command, its stdout a pipe, prints every header whole."""
    (path,) = (ROOT / "results" / "readme" / "stream-consumers").glob("*011054*StreamKeepsConsumers*.json")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    for extra in (["--plain"], []):
        cp = subprocess.run(
            [sys.executable, "-m", "crashbench", "show", str(path), *extra],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert cp.returncode == 0, cp.stderr
        assert "designs_consumers:StreamKeepsConsumers" in cp.stdout and "…" not in cp.stdout, cp.stdout[:2000]
