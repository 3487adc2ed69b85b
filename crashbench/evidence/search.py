"""The harness's own decoder: which of a run's jobs a stored entry carries, found by the run's token
(crashbench.jobids) in its bytes, without asking the design how it stores its jobs.

Every id a run enqueues is its token then its number ("cbq7k2x9m4tz-000042"), a string that cannot
occur by chance. The search looks for it in raw bytes, which covers what queues store: JSON strings
(the token needs no escaping), msgpack and pickle strings (stored as their UTF-8 bytes), key names,
hash field names and set members with any prefix; and inside base64, which it recognizes by the
token's three encodings (one per byte alignment, standard and URL-safe alphabets) and decodes (a
Celery message's body). What it cannot see is said in the threat model
(docs/explanation/counts-and-evidence.md): an id compressed
(zlib, as RQ stores a job's data), encrypted, split, or base64-encoded twice.

Cost: one `bytes.find` per entry that holds no token (most of a reading's bytes are not jobs), and
six more for the base64 forms; an entry that holds the raw token is not searched for base64.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator

_B64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
_URLSAFE = bytes.maketrans(b"-_", b"+/")


class Needle:
    """A run's token, raw and in its base64 forms."""

    __slots__ = ("findall", "forms", "raw")

    def __init__(self, token: str) -> None:
        self.raw = token.encode()
        self.findall = re.compile(re.escape(self.raw) + rb"([0-9]+)").findall  # C speed: most entries hold one
        forms: set[bytes] = set()
        n = len(self.raw)
        for pad in range(3):  # the token's first byte at each position of a 3-byte group
            enc = base64.b64encode(b"\0" * pad + self.raw)
            # Only the characters made of the token's bits alone: (8 pad) / 6 rounded up, to 8 (pad + n) / 6.
            stable = enc[-(-8 * pad // 6) : 8 * (pad + n) // 6]
            forms.add(stable)
            forms.add(stable.translate(bytes.maketrans(b"+/", b"-_")))
        self.forms = tuple(sorted(forms))

    def anywhere(self, data: bytes) -> tuple[bool, bool]:
        """Whether `data` holds the raw token, and whether it holds one of its base64 forms: one look
        over a whole key's bytes, so that a key that holds no job costs seven finds, not seven an entry."""
        return self.raw in data, any(form in data for form in self.forms)

    def ids(self, data: bytes, b64: bool = True) -> list[str]:
        """The job ids (as crashbench spells them, without the token) that `data` carries, in order;
        only raw ones unless `b64`."""
        found = self._raw(data)
        if found or not b64:
            return found
        for form in self.forms:
            at = data.find(form)
            while at >= 0:
                for decoded in _decodings(data, at):
                    if got := self._raw(decoded):
                        found.extend(got)
                        break
                at = data.find(form, at + len(form))
        return list(dict.fromkeys(found))

    def _raw(self, data: bytes) -> list[str]:
        return [m.decode() for m in self.findall(data)]


def _decodings(data: bytes, at: int) -> Iterator[bytes]:
    """The base64 run around position `at` decoded from each of the four places it may start at (a
    character of the alphabet may stand before the encoded text)."""
    start, end = at, at
    while start > 0 and data[start - 1] in _B64:
        start -= 1
    while end < len(data) and (data[end] in _B64 or data[end] == 61):  # 61: "=", the padding
        end += 1
    run = data[start:end].translate(_URLSAFE)
    for skip in range(4):
        body = run[skip:].rstrip(b"=")
        if len(body) % 4 == 1:  # a character too many for any group: the run ends with a stray one
            body = body[:-1]
        body += b"=" * (-len(body) % 4)
        try:
            yield base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            continue
