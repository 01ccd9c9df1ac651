"""Cluster calls as analysis columns, for the capture pipeline (sans-IO): each message is a NATS
message as `wireproto.cluster.callcapture` records it, msgpack ``[subject, reply, headers,
payload]``.

- a call (it has a reply subject): ``call``, topic its subject, request id its reply subject;
- a reply: ``reply``, or ``refused`` when its headers carry a status (no responders, or the
  answering process was busy or failed), request id its subject (the call's reply subject).
"""

from __future__ import annotations

from typing import Any

import msgpack

from wireproto.codecs.nats import header_status, header_values
from wireproto.codecs.wpheader import STATUS_HEADER
from wireproto.payloads import NO_VALUE

__all__ = ["columns", "value"]


def columns(data: bytes, binary: bool, incoming: bool) -> tuple[str, str | None, str | None, int]:
    subject, reply, headers, payload = msgpack.unpackb(data)
    if not isinstance(subject, str) or not isinstance(payload, bytes):
        raise ValueError("a cluster message is [subject, reply, headers, payload]")
    if reply is not None:
        return "call", subject, str(reply), len(payload)
    refused = headers is not None and (header_status(headers) is not None
                                       or STATUS_HEADER in header_values(headers))
    return ("refused" if refused else "reply"), None, subject, len(payload)


def value(data: bytes, binary: bool, incoming: bool) -> Any:
    return NO_VALUE
