"""A plain (not editable) install finds its shipped scenarios from any directory, and its pytest
plugin through the entry point.

The editable install every other test runs under reads the checkout, so it cannot show what `pip
install crashbench` ships: this builds the wheel, installs it into a fresh virtual environment (its
dependencies from the package index) and runs the installed command where no ./scenarios exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # nothing of the checkout may leak into the installed command
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cp = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)], cwd=out)
    assert cp.returncode == 0, cp.stderr
    (path,) = out.glob("crashbench-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh virtual environment with the wheel installed the ordinary way (pip
    install, dependencies from the package index), with its pytest extra (the plugin's). This pip
    installs into it (--python) rather than a copy of pip bootstrapped into it (ensurepip, seconds):
    the environment then holds only crashbench and what it declares, not even pip and setuptools."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=False)
    target = ["--python", str(env_dir / "bin" / "python")]
    cp = run([sys.executable, "-m", "pip", *target, "install", "-q", f"{wheel}[pytest]"], cwd=env_dir, timeout=300)
    assert cp.returncode == 0, cp.stderr
    return env_dir / "bin"


def test_the_wheel_ships_every_scenario_and_every_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (ROOT / "scenarios").glob("*.toml")}
    assert shipped and {f"crashbench/scenarios/{n}" for n in shipped} <= names
    # pyproject.toml lists the packages (the scenarios need a mapping that find cannot make):
    # a subpackage added to crashbench/ but not to that list would be missing from every install.
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "crashbench").rglob("__init__.py")}
    assert on_disk <= set(listed), f"add {sorted(on_disk - set(listed))} to [tool.setuptools] packages"


def test_installed_crashbench_runs_the_default_scenario_from_another_directory(installed: Path, tmp_path: Path) -> None:
    assert not (tmp_path / "scenarios").exists()
    crashbench = str(installed / "crashbench")
    cp = run([crashbench, "list"], cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "default" in cp.stdout and "invalid" not in cp.stdout
    # the scenarios listed come from the installed package, not from this checkout
    assert str(ROOT / "scenarios") not in cp.stdout

    out = tmp_path / "result.json"
    cmd = [crashbench, "run", "--design", "naive", "--jobs", "200", "--kills", "1", "--plain", "--out", str(out)]
    cp = run(cmd, cwd=tmp_path)
    assert cp.returncode in (0, 1), cp.stderr + cp.stdout
    data = json.loads(out.read_text())
    assert data["scenario"]["name"] == "default"
    assert "site-packages" in data["scenario"]["source"]
    assert data["runs"][0]["counts"]["enqueued"] == 200


@pytest.mark.parametrize("design", ["arq", "saq"])
def test_installed_crashbench_runs_library_workers_under_another_interpreter(
    installed: Path, tmp_path: Path, design: str
) -> None:
    """--worker-python after a plain install, from a directory that is not the checkout: the other
    interpreter imports the installed package (it once linked crashbench/run in its place, and only
    the checkout on sys.path hid it: `No module named 'crashbench.run'`)."""
    from tests.test_worker_python import arq_python

    python = arq_python()  # .venv/arq: arq and saq, under redis-py 5
    out = tmp_path / "result.json"
    # saq: one worker running one job at a time, so that its start-up sweep aborts at most one job and
    # waits 5 s on it (tests/test_saq.py), not 5 s for each of a dozen jobs one after another.
    one = ["--workers", "1", "--concurrency", "1"] if design == "saq" else []
    cmd = [str(installed / "crashbench"), "run", "--design", design, "--jobs", "30", "--kills", "0", "--plain",
           *one, "--worker-python", python, "--out", str(out)]  # fmt: skip
    cp = run(cmd, cwd=tmp_path, timeout=300)
    assert cp.returncode in (0, 1), cp.stderr + cp.stdout
    data = json.loads(out.read_text())
    assert data["runs"][0]["counts"]["done"] == 30 and data["runs"][0]["problems"] == []
    assert data["environment"]["worker_python"] == python and design in data["environment"]["libraries"]


def test_the_installed_plugin_loads_through_its_entry_point(installed: Path, tmp_path: Path) -> None:
    """`pip install 'crashbench[pytest]'` and nothing else: the environment's pytest finds the plugin
    through the pytest11 entry point (no conftest, no -p), and its fixture runs a crash run."""
    (tmp_path / "test_queue.py").write_text(
        "def test_reliable(crashbench, pytestconfig):\n"
        "    import crashbench.pytest_plugin as plugin\n"
        "    assert pytestconfig.pluginmanager.get_plugin('crashbench') is plugin  # the entry point's name\n"
        "    assert 'site-packages' in plugin.__file__\n"
        "    result = crashbench.run(design='reliable', jobs=200, kills=1, interval=0.1, stale_after=0.3)\n"
        "    result.assert_valid()\n"
        "    assert result.counts.done == 200 and result.report.is_file()\n"
    )
    cp = run([str(installed / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tmp_path)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "1 passed" in cp.stdout
