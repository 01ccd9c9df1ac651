"""nydus paths and hub topics, both ways, and hub messages as nydus PUBLISHes (docs/nydus.md,
"Paths and hub topics")."""

from __future__ import annotations

import base64
import os

from wireproto.codecs import nydus
from wireproto.codecs.nydus import Publish
from wireproto.errors import ProtocolError
from wireproto.hub import HubMessage
from wireproto.payloads import json_from_payload

__all__ = [
    "call_name",
    "publish_head",
    "nanoid",
    "topic_of_path",
    "path_of_topic",
    "encode_for_nydus",
]

def nanoid() -> str:
    """A random id of 21 characters from ``[A-Za-z0-9_-]`` (126 bits), as nanoid makes them."""
    return base64.urlsafe_b64encode(os.urandom(16))[:21].decode("ascii")


# -- paths and hub topics -------------------------------------------------------------------------


def topic_of_path(path: str) -> str:
    """The hub topic of a nydus path: the path without its leading ``/``."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(
            f"nydus path {path!r} has no hub topic: only paths that start with '/' map onto "
            "hub topics ('/chat/room' is the topic 'chat/room')"
        )
    return path[1:]


def path_of_topic(topic: str) -> str:
    """The nydus path of a hub topic: ``/`` and the topic."""
    return "/" + topic


def call_name(path: str) -> str:
    """What an INVOKE of `path` is checked as: its hub topic (the path without its leading
    ``/``), or the path itself where it has none."""
    return path[1:] if path.startswith("/") else path


def publish_head(path: str) -> bytes:
    """``4~path|``, the path written as encodeURI writes it; InvalidTopic for a bad path."""
    return nydus.encode(Publish(path)).encode("utf-8")


def encode_for_nydus(message: HubMessage) -> tuple[bytes, bool] | None:
    """A hub message as a nydus PUBLISH text message, or None when JSON cannot carry its payload
    or its topic makes no nydus path."""
    try:
        body = json_from_payload(message.payload)
        if body is None:
            return None
        return publish_head(path_of_topic(message.topic)) + body, False
    except ProtocolError:
        return None
