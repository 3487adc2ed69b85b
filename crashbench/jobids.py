"""Job ids held as integers, so that a run of ten million jobs costs bytes per job, not a string each.

A run's ids are its job numbers written with at least six digits ("000042"; crashbench.model.workload).
Such an id's code is its number; any other id (a test's "a", an id no enqueue made) gets a negative
code from a table of this process, so that every id has exactly one code and one spelling back.

On the wire, a run's ids carry the run's token (`token()`: "cb", ten random base-32 characters, and a
"-", so "cbq7k2x9m4tz-000042"): a string that cannot occur by chance, which the harness searches every
stored byte for (crashbench.evidence.search) without asking the design how it stores its jobs. The
token is registered in the harness's process (`register`), where it is stripped on the way in: inside
crashbench a job is its number, and every record, result and timeline spells it without the token.

`JobIds` is a run's ids (or an enqueue's): a range of codes when they are consecutive job numbers,
as they are when crashbench enqueues them, otherwise an array of codes (8 bytes per id). It reads as
a sequence of the id strings, and answers `in` without a set.
"""

from __future__ import annotations

import secrets
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

_names: list[str] = []  # code -1 - i <-> _names[i]: the ids that are not job numbers
_codes: dict[str, int] = {}
_tokens: set[str] = set()  # the tokens of this process's runs: stripped from an id on the way in

TOKEN_HEAD = "cb"
TOKEN_LEN = 13  # "cb" + 10 base-32 characters + "-"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def token() -> str:
    """A new run token: "cb", ten random characters of [a-z2-7] (50 bits), and "-"."""
    return TOKEN_HEAD + "".join(secrets.choice(_ALPHABET) for _ in range(10)) + "-"


def is_token(text: str) -> bool:
    return (
        len(text) == TOKEN_LEN and text.startswith(TOKEN_HEAD) and text[-1] == "-"
        and all(c in _ALPHABET for c in text[2:-1])
    )  # fmt: skip


def register(run_token: str) -> None:
    """Strip `run_token` from the ids this process reads from now on (the harness's, for its run)."""
    if not is_token(run_token):
        raise ValueError(f"not a run token: {run_token!r}")
    _tokens.add(run_token)


def wire(job: str, run_token: str) -> str:
    """The id as the queue sees it: the run's token, then the id."""
    return run_token + job


def plain(job: str) -> str:
    """The id without any run token's look (a worker's process knows no token, and a job's workload is
    drawn from its plain id, so that every run of a seed agrees)."""
    if len(job) > TOKEN_LEN and job.startswith(TOKEN_HEAD) and is_token(job[:TOKEN_LEN]):
        return job[TOKEN_LEN:]
    return job


def _strip(job: str) -> str:
    if _tokens and len(job) > TOKEN_LEN and job[:TOKEN_LEN] in _tokens:
        return job[TOKEN_LEN:]
    return job


def canonical(job: str) -> str:
    """The id as crashbench spells it: a registered token stripped (another run's id keeps its token)."""
    return _strip(job)


def _number(job: str) -> int | None:
    """The job number a canonical id spells (six digits, or more without a leading 0), else None; a
    registered run token before it is stripped."""
    job = _strip(job)
    if job.isascii() and job.isdigit() and (len(job) == 6 or (len(job) > 6 and job[0] != "0")):
        return int(job)
    return None


def code(job: str) -> int:
    """The id's code: its number for a canonical job number, else a negative code of its own."""
    if (n := _number(job)) is not None:
        return n
    job = _strip(job)
    found = _codes.get(job)
    if found is None:
        _names.append(job)
        found = _codes[job] = -len(_names)
    return found


def name(c: int) -> str:
    """The id a code stands for."""
    return f"{c:06d}" if c >= 0 else _names[-1 - c]


def known(job: str) -> int | None:
    """The id's code, without giving a new one to an id never seen (None then)."""
    n = _number(job)
    return n if n is not None else _codes.get(_strip(job))


class JobIds(Sequence[str]):
    """Job ids by their codes: a range (consecutive job numbers) or an array."""

    __slots__ = ("_set", "codes")

    def __init__(self, codes: range | array[int]) -> None:
        self.codes = codes
        self._set: frozenset[int] | None = None  # an array's codes, for `in`: built when first asked

    @classmethod
    def of(cls, ids: Iterable[str]) -> JobIds:
        if isinstance(ids, JobIds):
            return ids
        codes = array("q", map(code, ids))
        if codes and codes[0] >= 0 and codes == array("q", range(codes[0], codes[0] + len(codes))):
            return cls(range(codes[0], codes[0] + len(codes)))
        return cls(codes)

    @classmethod
    def concat(cls, parts: Iterable[JobIds]) -> JobIds:
        """One sequence of all of `parts`, in order; a range again when they follow each other."""
        parts = list(parts)
        if all(isinstance(p.codes, range) for p in parts):
            start = parts[0].codes.start if parts else 0
            stop = start
            for p in parts:
                if p.codes.start != stop and len(p.codes):
                    break
                stop = p.codes.stop if len(p.codes) else stop
            else:
                return cls(range(start, stop))
        out = array("q")
        for p in parts:
            out.extend(p.codes)
        return cls(out)

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> JobIds: ...
    def __getitem__(self, i: int | slice) -> str | JobIds:
        if isinstance(i, slice):
            return JobIds(self.codes[i])
        return name(self.codes[i])

    def __iter__(self) -> Iterator[str]:
        if isinstance(self.codes, range) and self.codes.start >= 0:
            return (f"{c:06d}" for c in self.codes)
        return map(name, self.codes)

    def __contains__(self, job: object) -> bool:
        if not isinstance(job, str):
            return False
        c = known(job)
        if c is None:
            return False
        if isinstance(self.codes, range):
            return c in self.codes
        if self._set is None:
            self._set = frozenset(self.codes)
        return c in self._set

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JobIds):
            return list(self.codes) == list(other.codes)
        if isinstance(other, list | tuple):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.codes))

    def __repr__(self) -> str:
        shown = f"{self.codes!r}" if isinstance(self.codes, range) else f"{len(self.codes)} codes"
        return f"JobIds({shown})"


class Marks:
    """A set of job codes: a byte per job number (up to a bound, so a stray huge number cannot make it
    huge), a set for the rest. `add` says whether the code was new."""

    __slots__ = ("numbers", "others")

    def __init__(self) -> None:
        self.numbers = bytearray()
        self.others: set[int] = set()

    def has(self, c: int) -> bool:
        return (0 <= c < len(self.numbers) and self.numbers[c] == 1) or c in self.others

    def add(self, c: int) -> bool:
        marks = self.numbers
        if c < 0 or c >= 2 * len(marks) + 1_048_576:
            if c in self.others:
                return False
            self.others.add(c)
            return True
        if c >= len(marks):
            marks.extend(bytes(max(c + 1 - len(marks), len(marks))))
        if marks[c]:
            return False
        marks[c] = 1
        return True
