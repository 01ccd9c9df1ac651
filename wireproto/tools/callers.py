"""What ``wireproto call`` speaks to a protocol with: a caller class per protocol, which a
protocol's descriptor names as its `caller` (wireproto.protocols)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer

if TYPE_CHECKING:
    from wireproto.protocols.client import ClientBase

__all__ = ["Caller", "UbreCaller", "NydusCaller"]


class Caller(Protocol):
    """What ``wireproto call`` asks of a protocol's caller: its client, the errors that are the
    other side's answer, and one call."""

    client: ClientBase[Any]
    failures: tuple[type[Exception], ...]

    def ask(self, target: str, data: tuple[Any] | None, timeout: float) -> defer.Deferred[Any]:
        ...


class UbreCaller:
    """``wireproto call`` over UBRE: a request to a named handler."""

    def __init__(self, reactor: Any, address: str, timeout: float, **options: Any) -> None:
        from wireproto.protocols.rpc import RequestFailed
        from wireproto.protocols.ubre.client import UbreClient

        self.client = UbreClient(reactor, address, request_timeout=timeout, **options)
        self.failures: tuple[type[Exception], ...] = (RequestFailed,)

    def ask(self, target: str, data: tuple[Any] | None, timeout: float) -> defer.Deferred[Any]:
        from wireproto.codecs.ubre import NO_BODY

        return self.client.request(target, NO_BODY if data is None else data[0], timeout=timeout)


class NydusCaller:
    """``wireproto call`` over nydus: an INVOKE of a route."""

    def __init__(self, reactor: Any, address: str, timeout: float, **options: Any) -> None:
        from wireproto.protocols.nydus.client import NydusClient
        from wireproto.protocols.nydus.invocation import InvokeError
        from wireproto.protocols.rpc import RequestFailed

        self.client = NydusClient(reactor, address, welcome_timeout=timeout, **options)
        self.failures = (RequestFailed, InvokeError)

    def ask(self, target: str, data: tuple[Any] | None, timeout: float) -> defer.Deferred[Any]:
        from wireproto.codecs.nydus import NO_DATA

        return self.client.invoke(target, NO_DATA if data is None else data[0], timeout=timeout)
