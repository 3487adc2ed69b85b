"""The results directory as a store: every saved result is a JSON file named after its id
(`<date>-<time>-<run id>-<kind>-<scenario>-<designs>.json`, or `<id>-bench.json` for `crashbench
bench`), found by path, id or id prefix, or `latest` (the latest crash result: a bench result holds
no counts to show, replay or check); listed newest first, both kinds, bench marked as such."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from crashbench.errors import UsageError
from crashbench.model.bench import BENCH_SCHEMA
from crashbench.model.results import SCHEMA, Result

DEFAULT_DIR = Path("results")


@dataclass(frozen=True, slots=True)
class Entry:
    """What `crashbench results` lists about a saved result, without building the whole of it."""

    path: Path
    id: str
    created: str
    kind: str
    scenario: str
    fingerprint: str
    designs: list[str]
    repeat: int
    status: str
    commit: str | None
    dirty: bool | None


def _files(directory: Path) -> list[Path]:
    # Ids start with the date and time, so names sort in time order.
    return sorted(directory.glob("*.json"), reverse=True) if directory.is_dir() else []


def _schema(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("schema")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def check_out(out: Path) -> None:
    """Raise UsageError unless a result can be written to `out` (a .json file, or a directory that is
    created if missing): checked before a run, so that a long one is not thrown away at the end."""
    target = out if out.suffix == ".json" else out / "x.json"
    if target.is_dir():
        raise UsageError(f"--out {out}: {target} is a directory", hint="give a .json file or a directory")
    existing = target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the nearest ancestor that exists is where the directories are made
    if not existing.is_dir():
        raise UsageError(f"--out {out}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"--out {out}: not writable", hint="choose a path you can write to")


def resolve(ref: str, directory: Path = DEFAULT_DIR) -> Path:
    """A result file from a path, an id (or a unique prefix of one) or `latest`."""
    path = Path(ref)
    if path.is_file():
        return path
    files = _files(directory)
    if ref == "latest":
        # Newest first, so this reads one file unless bench results came after the last crash result.
        latest = next((f for f in files if _schema(f) == SCHEMA), None)
        if latest is None:
            raise UsageError(f"no saved crash results in {directory}/", hint="crashbench results lists what is there")
        return latest
    matches = [f for f in files if f.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(
            f"no result {ref!r}: not a file, nor an id in {directory}/", hint="crashbench results lists them"
        )
    names = ", ".join(f.name for f in matches[:5])
    raise UsageError(f"{ref!r} matches {len(matches)} results ({names}{', ...' if len(matches) > 5 else ''})")


def load(ref: str, directory: Path = DEFAULT_DIR) -> Result:
    path = resolve(ref, directory)
    if _schema(path) == BENCH_SCHEMA:
        raise UsageError(
            f"{path} is a bench result (crashbench bench): it has no crash counts to show, replay or check",
            hint="its JSON has every measurement; crashbench results lists both kinds",
        )
    try:
        return Result.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {exc}"
        raise UsageError(f"{path}: cannot read it as a crashbench result ({why})") from None


def _bench_entry(path: Path, data: dict) -> Entry:
    env, st = data["environment"], data["settings"]
    return Entry(
        path, data["id"], data["created"], "bench", "-", "-", list(st["designs"]), st.get("repeat", 1), "-",
        env.get("commit"), env.get("dirty"),
    )  # fmt: skip


def entries(
    directory: Path = DEFAULT_DIR, scenario: str | None = None, design: str | None = None, kind: str = "all"
) -> list[Entry]:
    """Saved results, newest first: crash results and bench results (kind "bench"), or only one of
    them (`kind` "crash" / "bench"); those of other scenarios (name or fingerprint) or without the
    design are left out. Files that are not results of these schemas are skipped."""
    out = []
    for path in _files(directory):
        try:
            data = json.loads(path.read_text())
            if data.get("schema") == BENCH_SCHEMA:
                if kind != "crash" and scenario is None and (design is None or design in data["settings"]["designs"]):
                    out.append(_bench_entry(path, data))
                continue
            if kind == "bench" or data.get("schema") != SCHEMA:
                continue
            env = data["environment"]
            designs = list(dict.fromkeys(r["variant"] or r["design"] for r in data["runs"]))
            entry = Entry(
                path, data["id"], data["created"], data["kind"], data["scenario"]["name"], data["fingerprint"],
                designs, data.get("repeat", 1), data.get("status", "?"), env.get("commit"), env.get("dirty"),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if scenario is not None and scenario not in (entry.scenario, entry.fingerprint):
            continue
        if design is not None and design not in entry.designs:
            continue
        out.append(entry)
    return out
