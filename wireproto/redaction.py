"""What a log or an error line may show of a URL: never a credential.

A URL, or an HTTP request's target, is shown with its ``user:password@`` replaced by ``***@``
and the value of every query parameter whose name says it is a secret replaced by ``***``: a
name that, in any case and percent-decoded, contains one of `SECRET_WORDS` (``access_token``,
``password``, ``api_key``, ``X-Amz-Signature``, ``sessionid``...) or is one of `SECRET_NAMES`
(``sig``, ``pass``); so is a fragment's (``#access_token=...``, where OAuth's implicit flow puts a
token). On a path that checks credentials every query value is replaced: a client
may put a secret in any of them, and an Engine.IO ``sid`` speaks for its session to whoever
holds it. The names stay, so a line still says what was asked.

`redact_text` does the same to every URL in a line of text (an error that repeats what it was
given), for what prints or logs lines that may hold one.

>>> redact_url("ws://carol:secret@broker:8765/websmq?access_token=eyJ.x.y&v=2")
'ws://***@broker:8765/websmq?access_token=***&v=2'
>>> redact_url("/metrics?Password=p&apiKey=k&sig=s&page=2")
'/metrics?Password=***&apiKey=***&sig=***&page=2'
>>> redact_url("/engine.io/?EIO=4&transport=polling&sid=AbC", every_value=True)
'/engine.io/?EIO=***&transport=***&sid=***'
>>> redact_url("/websmq?v=1;access%5Ftoken=eyJ.x.y")
'/websmq?v=1;access%5Ftoken=***'
>>> redact_url("https://app.example/cb#access_token=eyJ.x.y&expires_in=3600")
'https://app.example/cb#access_token=***&expires_in=3600'
>>> redact_url("/docs?page=2#password=p")
'/docs?page=2#password=***'
>>> redact_url("serial:/dev/ttyACM0:baudrate=115200")
'serial:/dev/ttyACM0:baudrate=115200'
>>> redact_text("bad WebSocket URL 'ws://u:pw@h/x?token=t': no port")
"bad WebSocket URL 'ws://***@h/x?token=***': no port"
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = ["REDACTED", "SECRET_WORDS", "SECRET_NAMES", "is_secret_parameter", "redact_url",
           "redact_text", "has_user_information"]

REDACTED = "***"
# A query parameter carries a secret if its name contains one of these words...
SECRET_WORDS = ("token", "password", "passwd", "pwd", "secret", "key", "auth", "credential",
                "signature", "session", "jwt")
# ...or is one of these names.
SECRET_NAMES = frozenset({"sig", "pass"})


def is_secret_parameter(name: str) -> bool:
    """Whether a query parameter named `name` (as sent, percent-encoded or not) holds a
    secret."""
    name = unquote_plus(name).lower()
    return name in SECRET_NAMES or any(word in name for word in SECRET_WORDS)


def _authority(url: str) -> tuple[str, str, str] | None:
    """`url` as what comes before its authority (``ws://``), its authority, and the rest;
    None if it has no authority (a path, an endpoint string)."""
    scheme, separator, rest = url.partition("://")
    if url.startswith("//"):  # a network-path reference: an authority without a scheme
        scheme, separator, rest = "", "//", url[2:]
    if not (separator and (scheme or separator == "//") and "/" not in scheme
            and "?" not in scheme):
        return None
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    return scheme + separator, rest[:end], rest[end:]


def has_user_information(url: str) -> bool:
    """Whether `url` carries ``user@`` or ``user:password@`` in its authority."""
    parts = _authority(url)
    return parts is not None and "@" in parts[1]


def redact_url(url: str, *, every_value: bool = False) -> str:
    """`url` (absolute, or a path and query) without its user information and without the
    values of its secret query (and fragment) parameters (of all of them with `every_value`)."""
    parts = _authority(url)
    if parts is not None and "@" in parts[1]:
        before, authority, rest = parts
        url = f"{before}{REDACTED}@{authority.rsplit('@', 1)[1]}{rest}"
    url, hash_mark, fragment = url.partition("#")
    base, question, query = url.partition("?")
    return (base + question + _redacted_parameters(query, every_value)
            + hash_mark + _redacted_parameters(fragment, every_value))


def _redacted_parameters(text: str, every_value: bool) -> str:
    """A query (or a fragment written as one) with its secret values replaced."""
    # Split as twisted.web reads a query: at "&" and at ";".
    parts = re.split(r"([&;])", text)
    for index in range(0, len(parts), 2):
        name, equals, value = parts[index].partition("=")
        if equals and value and (every_value or is_secret_parameter(name)):
            parts[index] = f"{name}={REDACTED}"
    return "".join(parts)


# A URL in running text: a scheme and "//", up to a space or a quote that could close it.
_URL = re.compile(r"""\b[A-Za-z][A-Za-z0-9+.-]*://[^\s"<>`]+""")
# What may follow a URL in a sentence without being part of it.
_TRAILING = "'.,;:)]}"


def redact_text(text: str) -> str:
    """`text` with every URL in it shown as `redact_url` shows one."""
    if "://" not in text:
        return text

    def shown(match: re.Match[str]) -> str:
        url = match.group()
        kept = len(url.rstrip(_TRAILING))
        return redact_url(url[:kept]) + url[kept:]

    return _URL.sub(shown, text)
