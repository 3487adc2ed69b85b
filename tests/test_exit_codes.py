"""Every way crashbench can end is a documented `ExitCode`: the source has no other exit, the README's
table lists exactly those codes, and each category comes out of a real run as documented (0, 1 and 4
come out of tests/test_check.py's threshold cases)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import psutil
import pytest

from crashbench import errors
from crashbench.cli import gate as cli_gate
from crashbench.cli.gate import EXIT_FOR_STATUS
from crashbench.errors import ExitCode
from tests.test_cli import SMALL, assert_clean_error, crashbench, crashbench_here

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "crashbench"

# Every call that ends a process, by (file, function), and why it is allowed. The CLI's exits all
# take an ExitCode; the others end forked children, whose exit status crashbench reads itself.
ALLOWED_EXITS = {
    ("cli/common.py", "fail"): "a CrashbenchError's exit_code (an ExitCode)",
    ("cli/common.py", "report"): "cli_gate.exit_code: an ExitCode from the result's status",
    ("cli/__init__.py", "main"): "gate.run_cli: an ExitCode around click's own exits",
    ("console.py", "main"): "INTERRUPTED, ExitCode.INTERRUPTED's value (the test below): a signal while it imports",
    ("control/supervisor.py", "_run"): "a forked worker child ends with os._exit, never returning into the runner",
    ("control/supervisor.py", "_become_worker"): "likewise, when its parent died before it could watch it",
    ("control/pidns.py", "_become_init"): "a host's forked init ends with os._exit if its exec fails, never returning",
    ("control/zygote.py", "start"): "the forked fork server ends with os._exit, never returning into the runner",
    ("control/zygote.py", "_become_zygote"): "likewise, when its parent died before it could watch it",
    ("control/zygote.py", "_fork_spare"): "the fork server's intermediate child, and a spare whose worker returned",
    ("control/zygote.py", "_spare"): "a spare never given work, or whose runner died before it was handed over",
    ("control/reaper.py", "_start"): "the forked watchdog child ends with os._exit, never returning into the runner",
    ("control/proxy.py", "<module>"): "the network fault proxy's own process (python -m): crashbench reads its status",
    (
        "designs/app.py",
        "probe_main",
    ): "the app probe's process (under --worker-python): crashbench reads its answer",
}
# Modules that run as worker processes (crashbench reads how a worker ended; it is not crashbench's exit).
WORKER_MODULES = {"run/worker.py", "run/gevent_worker.py", "designs/handler.py", "run/remote.py"}


def exits_in(path: Path) -> list[tuple[str, str, str]]:
    """(function, call source, argument source) of every sys.exit / os._exit / ctx.exit / exit() /
    quit() / raise SystemExit in a module."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                f = child.func
                called = ast.unparse(f)
                if (isinstance(f, ast.Attribute) and f.attr in ("exit", "_exit")) or called in ("exit", "quit"):
                    found.append((function, called, ", ".join(ast.unparse(a) for a in child.args)))
            if isinstance(child, ast.Raise) and child.exc is not None and "SystemExit" in ast.unparse(child.exc):
                found.append((function, "raise SystemExit", ast.unparse(child.exc)))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_every_exit_in_the_source_is_an_allowed_one_and_the_cli_s_take_an_exit_code() -> None:
    seen: set[tuple[str, str]] = set()
    for path in sorted(SOURCE.rglob("*.py")):
        for function, called, args in exits_in(path):
            name = path.relative_to(SOURCE).as_posix()
            where = (name, function)
            if name in WORKER_MODULES:
                continue
            assert where in ALLOWED_EXITS, f"{name}: {function} calls {called}({args}): not a documented exit"
            seen.add(where)
            if name.startswith("cli/"):
                assert any(k in args for k in ("ExitCode", "exit_code", "run_cli")), f"{name} {function}: {args}"
    assert {w for w in ALLOWED_EXITS if w[0].startswith("cli/")} <= seen  # the CLI's are where this test looks
    for fn in (cli_gate.exit_code, cli_gate.run_cli):  # the two that compute a CLI exit
        assert typing.get_type_hints(fn)["return"] is ExitCode


INTERRUPT_WHILE_IMPORTING = """
import os, signal, sys
# As a shell starts it: an earlier test in this process may have left SIGINT ignored, and an ignored
# disposition is inherited, which Python then keeps instead of its KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)
class Hook:  # the signal arrives while the command line imports: before any command could catch it
    def find_spec(self, name, path=None, target=None):
        if name == "crashbench.cli.common":
            os.kill(os.getpid(), signal.%s)
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["crashbench", "list"]
from crashbench.console import main
main()
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_command_line_imports_exits_130_in_one_line(sig: str) -> None:
    from crashbench import console

    assert console.INTERRUPTED == ExitCode.INTERRUPTED  # its own copy, kept import-free
    cp = subprocess.run(
        [sys.executable, "-c", INTERRUPT_WHILE_IMPORTING % sig], capture_output=True, text=True, cwd=ROOT
    )
    assert cp.returncode == ExitCode.INTERRUPTED, (cp.returncode, cp.stderr)
    assert cp.stderr.strip() == "crashbench: error: interrupted" and cp.stdout == ""


def test_every_error_and_status_maps_to_an_exit_code() -> None:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.CrashbenchError)]
    assert len(classes) >= 6
    for cls in classes:
        assert isinstance(cls.exit_code, ExitCode), cls
    assert all(isinstance(code, ExitCode) for code in EXIT_FOR_STATUS.values())


def test_the_readme_table_lists_exactly_the_exit_codes() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \|", section, flags=re.MULTILINE)
    assert [(int(code), name) for code, name in rows] == [(c.value, c.name) for c in ExitCode]


def test_usage_errors_exit_2_also_from_click_s_own_parsing(tmp_path: Path) -> None:
    # One in a real process; the others through the same entry point in this one (tests.test_cli).
    assert_clean_error(crashbench("run", "--no-such-option", tmp_path=tmp_path), 2, "No such option")
    assert_clean_error(crashbench_here("run", "--jobs", "many", tmp_path=tmp_path), 2, "not a valid integer")
    assert_clean_error(crashbench_here("no-such-command", tmp_path=tmp_path), 2, "No such command")
    assert crashbench_here("--help", tmp_path=tmp_path).returncode == 0
    assert crashbench_here("--version", tmp_path=tmp_path).returncode == 0


def test_server_unavailable_exits_3(tmp_path: Path) -> None:
    cp = crashbench("check", "-t", "lost=0", "--redis-url", "redis://127.0.0.1:1/0", tmp_path=tmp_path)
    assert_clean_error(cp, 3, "cannot reach")


@pytest.mark.slow
def test_a_design_that_raises_exits_5_and_keeps_its_marked_work_directory(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT / "tests")}
    cp = crashbench("run", "-d", "designs_saboteur:StateRaises", *SMALL, "--kills", "1", "--out", str(tmp_path),
                    tmp_path=tmp_path, env=env)  # fmt: skip
    assert_clean_error(cp, 5, "ZeroDivisionError", "state is broken on purpose", "kept in")
    kept = Path(re.search(r"kept in (\S+)", cp.stderr).group(1))  # type: ignore[union-attr]
    try:
        assert (kept / "KEPT").is_file()  # so that no later run's orphan sweep removes it
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def _family(proc: subprocess.Popen[str], at_least: int, timeout: float = 20) -> list[psutil.Process]:
    """The process's descendants, once there are `at_least` of them."""
    deadline = time.monotonic() + timeout
    while True:
        family = psutil.Process(proc.pid).children(recursive=True)
        if len(family) >= at_least:
            return family
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the command never started its processes"
        time.sleep(0.02)


def _interrupt(args: list[str], at_least: int, signals: int, settle: float, tmp_path: Path) -> tuple[float, str]:
    """Start crashbench, wait for its processes, send SIGINT `signals` times; the seconds it took to
    end after the first one, and its stderr. It must exit 130 and leave no process behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *args, "--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        family = _family(proc, at_least)
        time.sleep(settle)
        family = psutil.Process(proc.pid).children(recursive=True) or family
        start = time.monotonic()
        for _ in range(signals):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert "Traceback" not in stderr and "Aborted!" not in stderr and "interrupted" in stderr
    _, alive = psutil.wait_procs(family, timeout=5)
    assert [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    return took, stderr


@pytest.mark.slow
def test_ctrl_c_while_jobs_are_enqueued_exits_130_at_once(tmp_path: Path) -> None:
    # 2M jobs take over 10 s to enqueue; the server is the one child while they are.
    took, stderr = _interrupt(["run", "-d", "naive", "--jobs", "2000000", "--kills", "0"], 1, 1, 1.5, tmp_path)
    assert "enqueueing" in stderr
    assert took < 2.5


def test_a_second_ctrl_c_exits_130_not_click_s_exit_1(tmp_path: Path) -> None:
    args = ["run", "-d", "reliable", "--jobs", "20000", "--interval", "0.2"]
    _interrupt(args, 5, 2, 0.3, tmp_path)  # server + 4 workers


@pytest.mark.slow
@pytest.mark.parametrize("signals", [2])  # one SIGINT / SIGTERM: tests/test_hygiene.py
def test_ctrl_c_in_bench_exits_130(signals: int, tmp_path: Path) -> None:
    # 50,000 jobs: enqueued in under 1 s; two reliable workers take over 10 s on them (~4,400 jobs/s)
    args = ["bench", "--designs", "reliable", "--workers", "2", "--jobs", "50000", "--repeat", "1"]
    _interrupt([*args, "--memory-jobs", "0"], 3, signals, 0.3, tmp_path)  # server + 2 workers


def test_an_unexpected_error_names_the_frame_of_crashbench_that_called_the_library() -> None:
    # A library's error (here json's) is reported where it was raised and where crashbench called it.
    from crashbench.errors import UnexpectedError
    from crashbench.model.workload import Workload

    with pytest.raises(ValueError) as caught:
        Workload.from_json("{")
    text = UnexpectedError.from_exception(caught.value, "test").message
    assert "json/decoder.py" in text and "called from" in text and "crashbench/model/workload.py" in text, text
