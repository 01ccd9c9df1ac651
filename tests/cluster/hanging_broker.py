"""A broker process for tests/cluster/test_call_failures.py to kill outright.

    python hanging_broker.py NATS_URL HEARTBEAT_INTERVAL DEAD_AFTER

It joins the cluster at NATS_URL and serves the UBRE request ``hang`` and the nydus route
``/hang`` with handlers that never answer. It prints ``origin ORIGIN`` (its origin as the
roster knows it) and ``ready`` once NATS has its subscriptions, then ``taken`` for each call its
handlers take."""

from __future__ import annotations

import sys

from twisted.internet import defer, reactor

from wireproto.cluster.settings import ClusterSettings
from wireproto.config import Config, parse_listen
from wireproto.service import make_service


def say(line: str) -> None:
    print(line, flush=True)


def never(*args: object) -> defer.Deferred:
    say("taken")
    return defer.Deferred()


@defer.inlineCallbacks
def serve(url: str, interval: float, lease: float) -> object:
    cluster = ClusterSettings(url=url, heartbeat_interval=interval, lease=lease)
    listeners = tuple(parse_listen(f"{protocol}+lines@tcp:0:interface=127.0.0.1")
                      for protocol in ("ubre", "nydus"))
    service = make_service(Config(listeners=listeners, cluster=cluster), reactor)
    service.startService()
    yield service.when_listening()
    service.server("ubre").handle("hang", never)
    service.server("nydus").register_route("/hang", never)
    yield service.cluster.when_ready()
    yield service.cluster.client.flush()
    say(f"origin {service.cluster.origin_token}")
    say("ready")


if __name__ == "__main__":
    url, interval, lease = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])

    def start() -> None:
        serve(url, interval, lease).addErrback(
            lambda failure: (failure.printTraceback(), reactor.stop()))

    reactor.callWhenRunning(start)
    reactor.run()
