"""A client of a few lines for the client-mode tests, started as `--run` starts a client
(``python -m tests.conformance.sample_client [--forever] [--pidfile FILE] [...]``, the address
from $WIREPROTO_CONFORM_URL): it connects, says ``hello``, echoes each message it receives, and
exits with status 3 on ``crash`` (after a line on stdout). With --forever it connects again
whenever its connection ends, as a client started by hand does between cases; with --pidfile it
writes its process id there first; with --backoff the pause before
each new connection doubles; with --say-token it prints $WIREPROTO_TOKEN; other arguments
are ignored (a test passes a secret-looking
one to see that the report never holds the command)."""

from __future__ import annotations

import os
import sys

from twisted.internet import reactor

from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect


class Echo(MessageProtocol):
    def connectionMade(self) -> None:
        self.transport.sendMessage(b"hello", True)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if data == b"crash":
            print("oh no", flush=True)
            os._exit(3)
        self.transport.sendMessage(data, True)

    def connectionLost(self, reason: object = None) -> None:
        if "--forever" in sys.argv:
            reactor.callLater(pause(), dial)


# With --backoff, the pause before connecting again doubles after each connection (0.5 s, 1 s,
# 2 s, 4 s...), as a client that backs off from a server closing it quickly does.
_pauses = [0.25]


def pause() -> float:
    if "--backoff" not in sys.argv:
        return 0.2
    _pauses[0] = min(_pauses[0] * 2, 16.0)
    return _pauses[0]


def dial() -> None:
    def failed(_: object) -> None:
        if "--forever" in sys.argv:
            reactor.callLater(0.2, dial)

    connect(reactor, os.environ["WIREPROTO_CONFORM_URL"], Echo).addErrback(failed)


if __name__ == "__main__":
    if "--say-token" in sys.argv:  # a client that prints a secret of its environment
        print(f"my token is {os.environ.get('WIREPROTO_TOKEN')}", flush=True)
    if "--pidfile" in sys.argv:
        with open(sys.argv[sys.argv.index("--pidfile") + 1], "a") as pids:
            pids.write(f"{os.getpid()}\n")
    reactor.callWhenRunning(dial)
    reactor.run()
