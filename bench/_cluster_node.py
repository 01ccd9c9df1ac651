"""One broker process of bench/cluster.py: `wireproto serve` as a library, joined to a NATS
server, with a UBRE handler ``echo`` when asked (a plain broker has no handlers).

    python bench/_cluster_node.py NATS_URL NODE [--echo]

Prints ``listening: PROTOCOL on ADDRESS`` per listener, then ``ready`` once linked to NATS.
"""

from __future__ import annotations

import sys
from pathlib import Path

from twisted.internet import reactor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wireproto.cluster.settings import ClusterSettings  # noqa: E402
from wireproto.config import Config, parse_listen  # noqa: E402
from wireproto.service import make_service  # noqa: E402

LISTEN = ("websmq+length32@tcp:0:interface=127.0.0.1", "ubre+lines@tcp:0:interface=127.0.0.1")


def main() -> None:
    url, node = sys.argv[1], sys.argv[2]
    config = Config(listeners=tuple(parse_listen(spec) for spec in LISTEN),
                    cluster=ClusterSettings(url=url, node=node))
    service = make_service(config, reactor)
    if "--echo" in sys.argv:
        service.server("ubre").handle("echo", lambda body, peer: body)
    service.startService()

    def listening(bound: list) -> None:
        for entry in bound:
            print(f"listening: {entry.listener.protocol} on {entry.address}", flush=True)
        service.cluster.when_ready().addCallback(lambda _: print("ready", flush=True))

    service.when_listening().addCallback(listening)
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()


if __name__ == "__main__":
    main()
