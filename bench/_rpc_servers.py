"""The servers that bench/rpc.py times round trips against, each run in a process of its own.

    python bench/_rpc_servers.py echo
    python bench/_rpc_servers.py ubre [--profile FILE]

`echo` is the floor: a bare Twisted Int32StringReceiver that sends every frame back as it came.
`ubre` is wireproto's UBRE server on a hub, as `wireproto serve` builds it, on two listeners:
length32 (either format) and lines (JSON only). Its default handler, for spec-form and binary
requests, and its handler named "echo" both answer with the request's body.

Both listen on 127.0.0.1, port 0, and print one line per listener, flushed, then "ready":

    bare-echo: echo over length32 on tcp:127.0.0.1:PORT
    wireproto: ubre over length32 on tcp:127.0.0.1:PORT
    wireproto: ubre over lines on tcp:127.0.0.1:PORT

`--profile FILE` runs the reactor under cProfile and writes its stats to FILE when the process
is stopped (SIGTERM or SIGINT).
"""

from __future__ import annotations

import argparse
import cProfile
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory
from twisted.protocols.basic import Int32StringReceiver

LISTEN = "tcp:0:interface=127.0.0.1"


class EchoProtocol(Int32StringReceiver):
    def stringReceived(self, data: bytes) -> None:
        self.sendString(data)


def echo_listeners() -> list[tuple[str, str, Factory]]:
    """(name, what it serves, factory) per listener."""
    return [("bare-echo", "echo over length32", Factory.forProtocol(EchoProtocol))]


def echo_handler(body: Any, peer: Any) -> Any:
    return body


def ubre_listeners() -> list[tuple[str, str, Any]]:
    from wireproto.hub import Hub
    from wireproto.protocols.ubre.server import UbreServer
    from wireproto.transports.stream import StreamOptions, stream_server_factory

    server = UbreServer(Hub())
    server.default_handler = echo_handler
    server.handle("echo", echo_handler)
    return [
        ("wireproto", f"ubre over {framing}",
         stream_server_factory(server, StreamOptions(framing=framing)))
        for framing in ("length32", "lines")
    ]


SERVERS: dict[str, Callable[[], list[tuple[str, str, Any]]]] = {
    "echo": echo_listeners,
    "ubre": ubre_listeners,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=sorted(SERVERS))
    parser.add_argument("--profile", metavar="FILE",
                        help="run under cProfile and write its stats to FILE on exit")
    args = parser.parse_args(argv)
    listeners = SERVERS[args.server]()

    async def listen() -> None:
        try:
            for name, what, factory in listeners:
                port = await serverFromString(reactor, LISTEN).listen(factory)
                address = port.getHost()
                print(f"{name}: {what} on tcp:{address.host}:{address.port}", flush=True)
        except Exception as e:
            print(f"{args.server}: cannot listen: {e}", file=sys.stderr, flush=True)
            reactor.stop()
            return
        print(f"{args.server}: ready", flush=True)

    reactor.callWhenRunning(lambda: defer.ensureDeferred(listen()))
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    reactor.run()  # Twisted stops the reactor on SIGTERM and SIGINT
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
