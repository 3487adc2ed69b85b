"""Where scenario files are found and how one is read into a TOML document, with a clean error for
every way a file can be unreadable (missing, not UTF-8, not TOML, nested too deeply).

Names are looked up in ./scenarios of the current directory first (a project's own scenarios win),
then in the scenarios shipped with crashbench: the package data `crashbench.scenarios`, read with
importlib.resources so a plain `pip install` finds them from any directory.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from crashbench.errors import ScenarioError

PACKAGE = "crashbench.scenarios"
# A source checkout run without any install (PYTHONPATH=.): the top-level scenarios/ beside the package.
_CHECKOUT = Path(__file__).resolve().parent.parent / "scenarios"


def packaged_dir() -> Path | None:
    """The shipped scenarios' folder, or None when crashbench was installed without them."""
    try:
        root = resources.files(PACKAGE)
    except ModuleNotFoundError:
        return _CHECKOUT if _CHECKOUT.is_dir() else None
    # Every install pip makes unpacks the package onto the file system; an import from a zip file
    # (no real folder) would need as_file per scenario, which nothing here installs that way.
    return root if isinstance(root, Path) else None


def scenario_dirs() -> list[Path]:
    """Where scenario names are looked up: ./scenarios, then the ones shipped with the package."""
    dirs = [Path.cwd() / "scenarios"]
    shipped = packaged_dir()
    if shipped is not None and shipped.resolve() != dirs[0].resolve():
        dirs.append(shipped)
    return dirs


def find(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or "/" in name_or_path:
        if path.is_file():
            return path
        raise ScenarioError(name_or_path, ["no such scenario file"])
    for d in scenario_dirs():
        candidate = d / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted({p.stem for p in available()})) or "none"
    raise ScenarioError(name_or_path, [f"no scenario of that name (known: {known})"])


def available() -> list[Path]:
    """Every scenario file found, one per name (./scenarios shadows a shipped one of the same name)."""
    seen: dict[str, Path] = {}
    for d in scenario_dirs():
        for p in sorted(d.glob("*.toml")):
            seen.setdefault(p.stem, p)
    return list(seen.values())


def read_document(path: Path) -> dict[str, Any]:
    """The file's TOML document; ScenarioError (exit 2) for anything that is not one."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    try:
        # TOML is UTF-8 by definition; a byte-order mark, as some editors write, is accepted.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        raise ScenarioError(str(path), [f"not UTF-8 text ({where}); TOML files are UTF-8"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(str(path), [f"not valid TOML: {exc}"]) from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ScenarioError(str(path), [f"not valid TOML: {str(exc).split(':')[0]}"]) from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ScenarioError(str(path), ["not valid TOML: arrays or tables nested too deeply"]) from None
