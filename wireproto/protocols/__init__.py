"""Spec protocols over message transports, and the registry the service builds listeners from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wireproto.transports.base import IMessageProtocol

__all__ = ["ServerProtocolSpec", "SERVER_PROTOCOLS", "server_protocol"]


@dataclass(frozen=True)
class ServerProtocolSpec:
    """How to serve one spec: its protocol factory, where it may run and its defaults."""

    name: str
    # make_factory(hub, **options) -> a zero-argument factory of server-role protocols
    make_factory: Callable[..., Callable[[], IMessageProtocol]]
    transports: frozenset[str]
    default_framing: str
    default_path: str


def _websmq(hub: Any, **options: Any) -> Callable[[], IMessageProtocol]:
    from wireproto.protocols.websmq.server import server_factory

    return server_factory(hub, **options)


def _ubre(hub: Any, **options: Any) -> Callable[[], IMessageProtocol]:
    from wireproto.protocols.ubre.server import server_factory

    return server_factory(hub, **options)


def _nydus(hub: Any, **options: Any) -> Callable[[], IMessageProtocol]:
    from wireproto.protocols.nydus.server import server_factory

    return server_factory(hub, **options)


def _subble(hub: Any, *, registry: str = "", **options: Any) -> Callable[[], IMessageProtocol]:
    from wireproto.protocols.subble.server import server_factory

    # The config's `registry` names the sqlite file ("" keeps the registry in memory).
    return server_factory(hub, registry_path=registry or None, **options)


SERVER_PROTOCOLS: dict[str, ServerProtocolSpec] = {
    "websmq": ServerProtocolSpec(
        name="websmq",
        make_factory=_websmq,
        transports=frozenset({"ws", "length32", "cobs"}),
        default_framing="length32",
        default_path="/websmq",
    ),
    "ubre": ServerProtocolSpec(
        name="ubre",
        make_factory=_ubre,
        transports=frozenset({"ws", "lines", "length32", "cobs"}),
        # Newline-delimited JSON, so `nc` users can type messages; length32 for binary.
        default_framing="lines",
        default_path="/ubre",
    ),
    "nydus": ServerProtocolSpec(
        name="nydus",
        make_factory=_nydus,
        # Engine.IO is what nydus-client speaks; ws and lines are wireproto's extensions.
        transports=frozenset({"engineio", "ws", "lines"}),
        default_framing="lines",
        default_path="/nydus",
    ),
    "subble": ServerProtocolSpec(
        name="subble",
        make_factory=_subble,
        # The request-data tail runs to the end of a message: only framings that mark it.
        transports=frozenset({"ws", "length32", "cobs"}),
        default_framing="length32",
        default_path="/subble",
    ),
}


def server_protocol(name: str) -> ServerProtocolSpec:
    try:
        return SERVER_PROTOCOLS[name]
    except KeyError:
        known = ", ".join(sorted(SERVER_PROTOCOLS))
        raise ValueError(f"unknown protocol {name!r}: known protocols are {known}") from None
