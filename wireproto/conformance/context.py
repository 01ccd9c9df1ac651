"""What a case's body works with (docs/conformance.md, "Writing a case"): the target, recorded
connections that are all closed when the case ends, a topic space of the run's own, and the
reactor's clock."""

from __future__ import annotations

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime

from wireproto.conformance.clientprocess import ClientProcess
from wireproto.conformance.listener import ClientProbe, Listener
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import PROBE_MAX_MESSAGE, Probe, Recorder, Target

__all__ = ["Context"]

# How long the kit waits for a case's connections to close before the next case starts.
CLOSE_WAIT = 1.0


class Context:
    """What a case's body works with: the target, its connections (all recorded, all closed
    when the case ends), a topic space of its own and the reactor's clock."""

    def __init__(self, reactor: IReactorTime, target: Target, recorder: Recorder,
                 run_id: str, *, listener: Listener | None = None,
                 client: ClientProcess | None = None) -> None:
        self.reactor = reactor
        self.target = target
        self.recorder = recorder
        self.run_id = run_id
        self.probes: list[Probe] = []
        # A client kit's: where the client connects, and the client's process with --run.
        self.listener = listener
        self.client = client
        # The case's own timeout (or --timeout's): a case that waits on the server's clock (a
        # heartbeat) knows how long it may.
        self.timeout = 5.0

    def topic(self, name: str = "t") -> str:
        """A topic of this run alone, under the target's prefix: `PREFIX/RUN/NAME`."""
        return f"{self.target.topic_prefix}/{self.run_id}/{name}"

    def note(self, text: str) -> None:
        """Add a line to the case's record (what the kit is about to check, say)."""
        self.recorder.add(0, "event", text=text)

    @staticmethod
    def fail(reason: str) -> CaseFailed:
        """The exception to raise for a behaviour not met: ``raise ctx.fail("...")``."""
        return CaseFailed(reason)

    async def connect(self, address: str | None = None, *, framing: str | None = None,
                      headers: dict[str, str] | None = None) -> Probe:
        """A new recorded connection to the target (or to `address`, another path of it),
        with the target's TLS options and headers (`headers` replace the target's; a stream
        has none). A
        connection that cannot be made is CaseFailed, its error in the reason."""
        from wireproto.transports.connect import connect, is_websocket_address
        from wireproto.transports.stream import StreamOptions
        from wireproto.transports.websocket import WebSocketOptions

        where = address or self.target.address
        target = self.target
        probe = Probe(self.recorder, self.reactor, target.receive_timeout, target.mask)
        self.probes.append(probe)
        try:
            if is_websocket_address(where):
                websocket = WebSocketOptions(max_message_size=PROBE_MAX_MESSAGE,
                                             auto_ping_interval=None, auto_ping_timeout=None)
                await connect(self.reactor, where, lambda: probe, websocket=websocket,
                              headers=target.headers if headers is None else headers,
                              cafile=target.cafile, insecure=target.insecure,
                              certfile=target.certfile, keyfile=target.keyfile)
            else:
                stream = StreamOptions(framing=framing or target.framing or "length32",
                                       max_message_size=PROBE_MAX_MESSAGE, keepalive_idle=0)
                await connect(self.reactor, where, lambda: probe, stream=stream,
                              cafile=target.cafile, insecure=target.insecure,
                              certfile=target.certfile, keyfile=target.keyfile)
        except defer.CancelledError:
            raise  # the run was stopped (Ctrl-C), not the connection refused
        except Exception as error:  # noqa: BLE001 - the reason goes to the report
            text = str(error).strip() or type(error).__name__
            self.recorder.add(probe.number, "event", text=f"could not connect: {text}")
            raise CaseFailed(f"could not connect: {text}") from error
        return probe

    async def accept(self, timeout: float | None = None,
                     what: str = "the client to connect") -> ClientProbe:
        """A client kit's: the next connection the client under test makes (or made since the
        last case), recorded as this case's; CaseFailed when none comes within `timeout`
        (the case's own timeout by default), or as soon as the client the kit started has
        ended without connecting."""
        if self.listener is None:
            raise RuntimeError("accept() is for client kits, which listen")
        probe = await self.listener.accept(self.recorder, self.timeout if timeout is None
                                           else timeout, what, self.client)
        self.probes.append(probe)
        return probe

    async def sleep(self, seconds: float) -> None:
        waiter: defer.Deferred[None] = defer.Deferred()
        self.reactor.callLater(seconds, waiter.callback, None)
        await waiter

    async def close_all(self) -> None:
        """Close every connection this case opened, waiting a little for each to end, and let
        go of what they received and the case did not read: the connection objects may live on
        a while (the transport's own references), and their messages must not."""
        for probe in self.probes:
            probe.close()
        deadline = self.reactor.seconds() + CLOSE_WAIT
        for probe in self.probes:
            if probe.transport is None or probe.closed_as is not None or not probe.connected:
                continue
            try:
                await probe.closed(max(0.01, deadline - self.reactor.seconds()))
            except CaseFailed:
                probe.abort()
        for probe in self.probes:
            probe.release()
        self.probes.clear()
