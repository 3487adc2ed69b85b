"""GitHub's rules for an action's metadata file (action.yml), for a composite action: what the runner
refuses to load, or loads and then fails on, checked before anything is pushed.

docs.github.com, "Metadata syntax for GitHub Actions": `name`, `description` and `runs` are required;
an input's id starts with a letter or `_` and holds only alphanumerics, `-` and `_`, and has a
`description`; a composite action's output has a `value` (and a `description`); `runs.using` is
`composite` with a list of `steps`, each one `run` (with its `shell`, which composite steps do not
default) or one `uses`. Besides: every `inputs.X` an expression uses is declared (an undeclared one is
silently empty), an output's value names a step id that exists, and no `${{ }}` is inside a `run:`
script (script injection: values reach a script through `env:`).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

TOP_KEYS = {"name", "author", "description", "inputs", "outputs", "runs", "branding"}
INPUT_KEYS = {"description", "required", "default", "deprecationMessage"}
STEP_KEYS = {"id", "if", "name", "uses", "run", "shell", "with", "env", "working-directory", "continue-on-error"}
ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)
INPUT_REF = re.compile(r"\binputs\.([A-Za-z0-9_-]+)")
STEP_REF = re.compile(r"\bsteps\.([A-Za-z0-9_-]+)\.outputs\.")


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def _expressions(meta: dict[str, Any], steps: list[Any]) -> list[str]:
    """Every expression the runner evaluates: ${{ }} in the outputs and steps, and each step's `if`."""
    found = [m for s in _strings([meta.get("outputs"), steps]) for m in EXPRESSION.findall(s)]
    return found + [str(step["if"]) for step in steps if isinstance(step, dict) and "if" in step]


def problems(text: str) -> list[str]:
    """What is wrong with an action.yml, one line each; [] when nothing is."""
    meta = yaml.safe_load(text)
    if not isinstance(meta, dict):
        return ["the file is not a mapping"]
    found = [f"missing required key {key!r}" for key in ("name", "description", "runs") if key not in meta]
    found += [f"unknown top-level key {key!r}" for key in meta if key not in TOP_KEYS]
    inputs = meta.get("inputs") or {}
    for name, spec in inputs.items():
        if not ID.match(str(name)):
            found.append(f"input id {name!r} is not valid (a letter or _, then alphanumerics, - and _)")
        if not isinstance(spec, dict) or "description" not in spec:
            found.append(f"input {name!r} has no description")
        elif unknown := set(spec) - INPUT_KEYS:
            found.append(f"input {name!r}: unknown keys {sorted(unknown)}")
    runs = meta.get("runs") or {}
    if runs.get("using") != "composite":
        found.append(f"runs.using is {runs.get('using')!r}, not 'composite'")
    steps = runs.get("steps")
    if not isinstance(steps, list) or not steps:
        found.append("runs.steps is not a non-empty list")
        steps = []
    ids = []
    for i, step in enumerate(steps):
        where = f"step {i + 1}" + (f" ({step['name']})" if isinstance(step, dict) and "name" in step else "")
        if not isinstance(step, dict):
            found.append(f"{where} is not a mapping")
            continue
        if ("run" in step) == ("uses" in step):
            found.append(f"{where} has neither or both of run and uses")
        if "run" in step and "shell" not in step:
            found.append(f"{where} runs a script without a shell")
        if "run" in step and "${{" in str(step["run"]):
            found.append(f"{where} interpolates an expression into its script (pass it through env:)")
        if unknown := set(step) - STEP_KEYS:
            found.append(f"{where}: unknown keys {sorted(unknown)}")
        if "id" in step:
            if not ID.match(str(step["id"])) or step["id"] in ids:
                found.append(f"{where}: step id {step['id']!r} is not valid or not unique")
            ids.append(step["id"])
    for name, spec in (meta.get("outputs") or {}).items():
        if not isinstance(spec, dict) or "value" not in spec or "description" not in spec:
            found.append(f"output {name!r} needs a description and a value")
            continue
        for step_id in STEP_REF.findall(str(spec["value"])):
            if step_id not in ids:
                found.append(f"output {name!r} reads step {step_id!r}, which no step has as its id")
    used = {ref for expr in _expressions(meta, steps) for ref in INPUT_REF.findall(expr)}
    found += [f"inputs.{name} is used but not declared" for name in sorted(used - set(inputs))]
    return found
