"""What a log may show of a URL: never a credential.

A URL, or an HTTP request's target, is logged with its ``user:password@`` and the value of
every credential query parameter (``access_token``, which browsers must use) replaced by
``***``. On a path that checks credentials every query value is replaced: a client may put a
secret in any of them, and an Engine.IO ``sid`` speaks for its session to whoever holds it.
The names stay, so a line still says what was asked.

>>> redact_url("ws://carol:secret@broker:8765/websmq?access_token=eyJ.x.y&v=2")
'ws://***@broker:8765/websmq?access_token=***&v=2'
>>> redact_url("/engine.io/?EIO=4&transport=polling&sid=AbC", every_value=True)
'/engine.io/?EIO=***&transport=***&sid=***'
>>> redact_url("/websmq?v=1;access%5Ftoken=eyJ.x.y")
'/websmq?v=1;access%5Ftoken=***'
>>> redact_url("serial:/dev/ttyACM0:baudrate=115200")
'serial:/dev/ttyACM0:baudrate=115200'
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = ["REDACTED", "CREDENTIAL_PARAMETERS", "redact_url"]

REDACTED = "***"
# Query parameters that carry a credential wherever they appear.
CREDENTIAL_PARAMETERS = frozenset({"access_token"})


def redact_url(url: str, *, every_value: bool = False) -> str:
    """`url` (absolute, or a path and query) without its user information and without the
    values of its credential query parameters (of all its query parameters with
    `every_value`)."""
    scheme, separator, rest = url.partition("://")
    if url.startswith("//"):  # a network-path reference: an authority without a scheme
        scheme, separator, rest = "", "//", url[2:]
    if separator and (scheme or separator == "//") and "/" not in scheme and "?" not in scheme:
        end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
        authority = rest[:end]
        if "@" in authority:
            rest = f"{REDACTED}@{authority.rsplit('@', 1)[1]}{rest[end:]}"
        url = scheme + separator + rest
    base, question, query = url.partition("?")
    if not question:
        return url
    query, hash_mark, fragment = query.partition("#")
    # Split as twisted.web reads a query: at "&" and at ";".
    parts = re.split(r"([&;])", query)
    for index in range(0, len(parts), 2):
        name, equals, value = parts[index].partition("=")
        if equals and value and (
            every_value or unquote_plus(name).lower() in CREDENTIAL_PARAMETERS
        ):
            parts[index] = f"{name}={REDACTED}"
    return base + question + "".join(parts) + hash_mark + fragment

