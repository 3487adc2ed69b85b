"""The results directory as a store: every saved result is a JSON file named after its id
(`<date>-<time>-<run id>-<kind>-<scenario>-<designs>.json`), found by path, id or id prefix, or
`latest`; listed newest first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from crashbench.errors import UsageError
from crashbench.results import Result

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


def resolve(ref: str, directory: Path = DEFAULT_DIR) -> Path:
    """A result file from a path, an id (or a unique prefix of one) or `latest`."""
    path = Path(ref)
    if path.is_file():
        return path
    files = _files(directory)
    if ref == "latest":
        if not files:
            raise UsageError(f"no saved results in {directory}/")
        return files[0]
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
    try:
        return Result.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path}: cannot read it as a crashbench result ({type(exc).__name__}: {exc})") from None


def entries(directory: Path = DEFAULT_DIR, scenario: str | None = None, design: str | None = None) -> list[Entry]:
    """Saved results, newest first; those of other scenarios (name or fingerprint) or without the design
    are left out. Files that are not results of this schema are skipped."""
    out = []
    for path in _files(directory):
        try:
            data = json.loads(path.read_text())
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
