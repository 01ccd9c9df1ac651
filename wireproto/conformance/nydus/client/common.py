"""The nydus client kit's catalogue and what its cases share: the driver's part of each case
(its INVOKEs, docs/conformance.md, "nydus clients: the driver and results"), a session past the
kit's WELCOME, and the check that a client still works."""

from __future__ import annotations

import functools
import json

from wireproto.codecs import nydus
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import ClientProbe
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.nydus.client.site import session_of
from wireproto.conformance.probe import Received
from wireproto.errors import ProtocolError

__all__ = ["ANSWERED", "CLIENT", "DECIDED", "ENGINEIO", "HELLO", "HELLO_DATA", "PUBLISHED",
           "RECONNECTING", "case", "kit", "answered", "decoded", "next_invoke", "publish",
           "published", "ready", "still_works", "welcomed"]

kit = Catalogue("nydus", "nydus-protocol 3.0.0 over Engine.IO 4", "docs/nydus.md",
                mode="client")
# A client started for a case (a Node runtime, say) may take a few seconds on a loaded machine
# before its first request: a case's default timeout leaves room for that.
CASE_TIMEOUT = 8.0
case = functools.partial(kit.case, timeout=CASE_TIMEOUT)

DECIDED = "docs/nydus.md#what-we-decided"
ENGINEIO = "docs/nydus.md#engineio-4"
CLIENT = "docs/nydus.md#the-client"
RECONNECTING = "docs/nydus.md#reconnecting"

# The driver's paths: what it INVOKEs once connected, to report an answer, and to report a
# PUBLISH it got.
HELLO = "/conformance/hello there"
HELLO_DATA = {"hello": "conformance"}
ANSWERED = "/conformance/answered"
PUBLISHED = "/conformance/published"


def decoded(message: Received) -> nydus.Message:
    """The nydus message the client sent; CaseFailed when it is none."""
    try:
        return nydus.decode(message.data)
    except ProtocolError as error:
        raise CaseFailed(f"the client sent {message.data[:80]!r}, which is no nydus message "
                         f"({error})") from None


async def next_invoke(probe: ClientProbe, path: str, what: str,
                      timeout: float = 3.0) -> nydus.Invoke:
    """The client's next INVOKE of `path`, other messages passed over."""
    def wanted(message: Received) -> bool:
        got = decoded(message)
        return isinstance(got, nydus.Invoke) and got.path == path
    found = decoded(await probe.receive_matching(wanted, timeout, what))
    assert isinstance(found, nydus.Invoke)
    return found


async def welcomed(ctx: Context, timeout: float | None = None) -> ClientProbe:
    """The client's next session, sent the WELCOME 0|3."""
    probe = await ctx.accept(timeout)
    probe.send(b"0|3", binary=False)
    return probe


async def ready(ctx: Context) -> tuple[ClientProbe, nydus.Invoke]:
    """A welcomed session and the driver's INVOKE of /conformance/hello there."""
    probe = await welcomed(ctx)
    hello = await next_invoke(probe, HELLO, f"the driver's INVOKE of {HELLO}", 5.0)
    return probe, hello


def answer(probe: ClientProbe, text: str) -> None:
    probe.send(text.encode("utf-8"), binary=False)


async def answered(probe: ClientProbe, what: str = "the driver's report of the answer",
                   timeout: float = 3.0) -> object:
    """The data of the driver's INVOKE of /conformance/answered."""
    got = await next_invoke(probe, ANSWERED, what, timeout)
    return None if got.data is nydus.NO_DATA else got.data


def publish(probe: ClientProbe, path: str, data: object = nydus.NO_DATA) -> None:
    answer(probe, nydus.encode(nydus.Publish(path, data)))


async def published(probe: ClientProbe, what: str = "the driver's report of the PUBLISH",
                    timeout: float = 3.0, path: str | None = None) -> dict[str, object]:
    """The data of the driver's INVOKE of /conformance/published (of a PUBLISH to `path`
    only, when given)."""
    deadline = probe.reactor.seconds() + timeout
    while True:
        got = await next_invoke(probe, PUBLISHED, what,
                                max(0.01, deadline - probe.reactor.seconds()))
        if path is None or not isinstance(got.data, dict) or got.data.get("path") == path:
            break
    if not isinstance(got.data, dict):
        shown = "no data" if got.data is nydus.NO_DATA else json.dumps(got.data)[:80]
        raise CaseFailed(f"the driver's INVOKE of {PUBLISHED} carries {shown}, not "
                         '{"path": ..., "data": ...}')
    return got.data


async def still_works(ctx: Context, probe: ClientProbe) -> str:
    """How the client came through what the case sent: it still reports a PUBLISH on this
    session, or it closed the session and came back on a new one. CaseFailed when its process
    ended, or it neither works nor comes back."""
    await ctx.sleep(0.3)
    client = ctx.client
    if client is not None and client.crashed:
        raise CaseFailed(f"the client {client.described()}")
    if client is not None and not client.running:
        # A driver may end when its connection is lost (--run starts it again).
        return f"it closed the session, and its process {client.described()}"
    if probe.is_open and session_of(probe).is_open:
        path = "/conformance/check"
        publish(probe, path, {"still": "working"})
        try:
            got = await published(probe, "the driver's report of a PUBLISH sent afterwards",
                                  path=path)
        except CaseFailed as failed:
            stopped = f"the client stopped working: {failed}"
            if client is not None and client.crashed:
                raise CaseFailed(f"{stopped}; the client {client.described()}") from None
            if ctx.listener is None or not ctx.listener.held:
                raise CaseFailed(stopped) from None
            # It left the session without a word, and came back on a new one.
        else:
            if got.get("data") != {"still": "working"}:
                raise CaseFailed(f"afterwards the driver reported {json.dumps(got)[:100]}")
            return "it kept working"
    try:
        again = await welcomed(ctx, 6.0)
        await next_invoke(again, HELLO, "the driver's INVOKE on its new session", 5.0)
    except CaseFailed as failed:
        if client is not None and client.crashed:
            raise CaseFailed(f"the client {client.described()}") from None
        if client is not None and not client.running:
            return f"it closed the session, and its process {client.described()}"
        if client is not None and not (probe.is_open and session_of(probe).is_open):
            # Not coming back is the reconnection cases' to report, not a failure here.
            return "it closed the session; its process still runs"
        raise CaseFailed(f"the client closed the session and did not work again: {failed}"
                         ) from None
    return "it closed the session and connected again"
