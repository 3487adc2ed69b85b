"""Credentials out of everything crashbench shows or keeps.

A Redis URL can carry a password (`redis://user:secret@host:6379/0`, or `?password=secret`). The
real URL is needed to connect and nowhere else: every message, log line, result and export shows
`redact_url(url)` (`redis://user:***@host:6379/0`), and text that may quote a URL or its password
(an exception's message, a library's complaint) goes through `redact_text` first.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"

# Query parameters that hold a secret: redis-py reads `password`; the others are common spellings.
_SECRET_PARAM = re.compile(r"(?i)([?&;](?:password|passwd|pass|pwd|secret|token)=)[^&;#\s]*")
# `scheme://userinfo@` anywhere in a text; the userinfo runs up to the last `@` of the word, so an
# unescaped `@` or `/` inside a password is still covered (at worst a path with an `@` is masked too).
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s'\"<>]*)@")
# A password shorter than this is not masked where it appears on its own in a text (outside a URL):
# masking every "1" or "ab" would garble numbers and words and hide nothing a reader could not guess.
MIN_LITERAL = 4


def _userinfo(userinfo: str) -> str:
    # `user:password` keeps the user; a userinfo without a colon is masked whole, because some
    # clients read `redis://secret@host` as a password.
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def redact_url(url: str) -> str:
    """The URL with its password and secret query parameters replaced by ***; otherwise unchanged
    (by pattern rather than parse and rebuild, which would normalise `unix:///path` and choke on a
    malformed URL that still has to be shown)."""
    return _SECRET_PARAM.sub(rf"\g<1>{MASK}", _USERINFO.sub(_mask_userinfo, url))


def _mask_userinfo(match: re.Match[str]) -> str:
    return f"{match.group(1)}{_userinfo(match.group(2))}@"


def secrets_of(url: str | None) -> list[str]:
    """The passwords a URL carries, as written and percent-decoded (a library may print either)."""
    if not url:
        return []
    found: list[str] = []
    if match := _USERINFO.search(url):
        userinfo = match.group(2)
        found.append(userinfo.partition(":")[2] if ":" in userinfo else userinfo)
    found += [m.group(0).partition("=")[2] for m in _SECRET_PARAM.finditer(url)]
    out: list[str] = []
    for secret in found:
        for form in (secret, unquote(secret)):
            if form and form not in out:
                out.append(form)
    return out


def redact_text(text: str, *urls: str | None) -> str:
    """`text` with the credentials of any URL in it masked, and with the passwords of `urls` masked
    wherever they appear on their own (a message that quotes the password but not the URL)."""
    text = redact_url(text)  # the patterns apply to a URL inside a text just as well
    for url in urls:
        for secret in sorted(secrets_of(url), key=len, reverse=True):  # the longer form first
            if len(secret) >= MIN_LITERAL:
                text = text.replace(secret, MASK)
    return text


def scrub_exception(exc: BaseException, *urls: str | None) -> None:
    """Mask credentials in an exception about to be reported, in place: its args (what str() shows)
    and a CrashbenchError's message and hint. A last net under the messages crashbench writes
    itself, for a library's exception that quotes the URL it was given."""
    exc.args = tuple(redact_text(a, *urls) if isinstance(a, str) else a for a in exc.args)
    for name in ("message", "hint"):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            setattr(exc, name, redact_text(value, *urls))
