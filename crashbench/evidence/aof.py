"""The harness's own reading of an append-only file: which of a run's jobs its commands name, found by
the run's token (crashbench.evidence.search), so that a power cut's evidence (crashbench.faults.power)
says by id which enqueues and acknowledgements reached the disk, without asking the design.

Redis 7 keeps its AOF as a directory (`appendonlydir/`): a manifest names a base file (an RDB preamble,
or an AOF) and the incremental files (`*.incr.aof`), each a series of commands in RESP, as the server
applied them (a script's effects, a MULTI ... EXEC around them; a stream entry's XADD with the id it
was given). Redis 6 keeps one `appendonly.aof`. `commands` splits a file into its commands and says how
many bytes at its end are a torn command (Redis loads such a file up to the last whole one, as
aof-load-truncated does); `mentions` lists, per job, the commands that name it: raw in an argument, or
through the id of a stream entry that carries it (an XACK or XDEL names the entry, not the job).

A base that is an RDB holding data (an AOF rewrite happened) is not read: its strings may be compressed.
`Aof.base_rdb_bytes` says how large it was, and a reading that met one says it cannot be exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from crashbench.evidence.search import Needle

MANIFEST = re.compile(rb"^file (\S+) seq (\d+) type ([bhi])\s*$", re.M)
EMPTY_RDB = 200  # an RDB preamble of an empty data set is under 100 bytes; one with data is larger
_ENTRY = re.compile(rb"^\d+-\d+$")


@dataclass(frozen=True, slots=True)
class Command:
    offset: int  # where it starts in its file
    end: int  # one past its last byte
    args: tuple[bytes, ...]

    @property
    def name(self) -> str:
        return self.args[0].decode(errors="replace").upper() if self.args else ""


def commands(data: bytes) -> tuple[list[Command], int]:
    """The commands of an AOF's bytes that a server loads, in order, and how many bytes after the last
    one it does not (a torn tail: 0 for an intact file). Bytes that are not RESP end the reading there;
    a MULTI with no EXEC after it is not loaded (Redis reverts an unfinished transaction at the end)."""
    out: list[Command] = []
    pos, n, multi = 0, len(data), None
    while pos < n:
        parsed = _command(data, pos)
        if parsed is None:
            break
        if parsed.name == "MULTI":
            multi = len(out)
        elif parsed.name == "EXEC":
            multi = None
        out.append(parsed)
        pos = parsed.end
    if multi is not None:
        pos = out[multi].offset
        del out[multi:]
    return out, n - pos


def _command(data: bytes, pos: int) -> Command | None:
    """The command at `pos`, or None if it is cut short or is not an array of bulk strings."""
    if data[pos : pos + 1] != b"*":
        return None
    eol = data.find(b"\r\n", pos)
    if eol < 0 or not data[pos + 1 : eol].isdigit():
        return None
    count, at, args = int(data[pos + 1 : eol]), eol + 2, []
    for _ in range(count):
        if data[at : at + 1] != b"$":
            return None
        eol = data.find(b"\r\n", at)
        if eol < 0 or not data[at + 1 : eol].isdigit():
            return None
        size = int(data[at + 1 : eol])
        start = eol + 2
        if start + size + 2 > len(data) or data[start + size : start + size + 2] != b"\r\n":
            return None
        args.append(data[start : start + size])
        at = start + size + 2
    return Command(pos, at, tuple(args))


@dataclass(slots=True)
class Aof:
    """An AOF's files as they lie in a data directory (`files`: name -> bytes, in the manifest's order)."""

    files: dict[str, bytes] = field(default_factory=dict)
    base_rdb_bytes: int = 0  # the size of an RDB base file (0: none, or an AOF base)

    @classmethod
    def read(cls, data_dir: Path) -> Aof:
        """The AOF under `data_dir`: Redis 7's appendonlydir (by its manifest), else Redis 6's single file."""
        out = cls()
        for d in sorted(p for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else []:
            manifests = sorted(d.glob("*.manifest"))
            if not manifests:
                continue
            listed = sorted(MANIFEST.findall(manifests[0].read_bytes()), key=lambda m: (m[2] != b"b", int(m[1])))
            for name, _, kind in listed:
                path = d / name.decode()
                data = path.read_bytes() if path.is_file() else b""
                if kind == b"b" and data.startswith(b"REDIS"):
                    out.base_rdb_bytes = len(data)
                elif kind != b"h":  # a history file is no longer part of the data set
                    out.files[name.decode()] = data
            return out
        single = data_dir / "appendonly.aof"
        if single.is_file():
            out.files["appendonly.aof"] = single.read_bytes()
        return out

    @property
    def exact(self) -> bool:
        """Whether every command of the data set is in RESP here (no RDB base holding data)."""
        return self.base_rdb_bytes < EMPTY_RDB

    def commands(self) -> Iterator[tuple[str, Command]]:
        for name, data in self.files.items():
            for c in commands(data)[0]:
                yield name, c

    def torn(self) -> dict[str, int]:
        """Per file, the bytes at its end that are not a whole command (only files that have some)."""
        return {name: t for name, data in self.files.items() if (t := commands(data)[1])}


def mentions(aof: Aof, needle: Needle) -> dict[str, list[str]]:
    """Per job id, the names of the commands that name it, in order: raw or base64 in an argument, or
    through a stream entry's id (the entry's XADD carries the job)."""
    out: dict[str, list[str]] = {}
    entries: dict[bytes, list[str]] = {}  # stream entry id -> the jobs its XADD carried
    for _, c in aof.commands():
        name = c.name
        ids: list[str] = []
        for arg in c.args[1:]:
            ids.extend(needle.ids(arg))
        if name == "XADD" and ids:
            for arg in c.args[2:]:
                if _ENTRY.match(arg):
                    entries[arg] = ids
                    break
        elif name in ("XACK", "XDEL", "XCLAIM", "XAUTOCLAIM"):
            for arg in c.args[2:]:
                ids.extend(entries.get(arg, ()))
        for job in dict.fromkeys(ids):
            out.setdefault(job, []).append(name)
    return out
