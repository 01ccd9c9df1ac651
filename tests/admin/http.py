"""HTTP for the admin tests: a broker with an HTTP port, one request through twisted.web's Agent
(its status, headers and body), and a tap read line by line."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import orjson
from twisted.internet import defer, protocol, reactor
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers

from tests.brokers import LOCAL, Broker
from tests.support import wait_for


@dataclass
class Answer:
    status: int
    headers: Headers
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    def header(self, name: str) -> str | None:
        found = self.headers.getRawHeaders(name.encode())
        return None if not found else found[0].decode()


LISTENERS = (f"websmq+ws@tcp:0:{LOCAL}", f"ubre+ws@tcp:0:{LOCAL}",
             f"nydus+engineio@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}")


async def start(broker: Broker, *listeners: str, **tables: Any
                ) -> tuple[Any, dict[str, str], str]:
    """A broker on LISTENERS (or `listeners`): its service, its addresses by
    ``protocol+transport``, and its HTTP port's base URL."""
    service, bound = await broker.start(*(listeners or LISTENERS), **tables)
    addresses = {f"{b.listener.protocol}+{b.listener.transport}": b.address for b in bound}
    http_address = next(address for address in addresses.values() if "://" in address)
    return service, addresses, base_of(http_address)


def base_of(address: str) -> str:
    """``ws://127.0.0.1:PORT/websmq`` -> ``http://127.0.0.1:PORT``."""
    return "http://" + address.split("://", 1)[1].split("/", 1)[0]


async def http(base: str, path: str, body: Any = None, *, method: str | None = None,
               headers: dict[str, str] | None = None, raw: bytes | None = None) -> Answer:
    """GET `path`, or POST `body` as JSON (or `raw` bytes as they are)."""
    sent = dict(headers or {})
    producer = None
    if body is not None or raw is not None:
        data = raw if raw is not None else orjson.dumps(body)
        sent.setdefault("content-type", "application/json")
        producer = FileBodyProducer(io.BytesIO(data))
    method = method or ("GET" if producer is None else "POST")
    request_headers = Headers({key.encode(): [value.encode()] for key, value in sent.items()})
    response = await wait_for(Agent(reactor).request(
        method.encode(), f"{base}{path}".encode(), request_headers, producer))
    return Answer(response.code, response.headers, await wait_for(readBody(response)))


class LineReader(protocol.Protocol):
    """A streamed body's lines as JSON values, as they come."""

    def __init__(self) -> None:
        self.lines: list[Any] = []
        self.pending = b""
        self.done: defer.Deferred = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.pending += data
        *complete, self.pending = self.pending.split(b"\n")
        self.lines.extend(orjson.loads(line) for line in complete if line)

    def connectionLost(self, reason: Any) -> None:
        self.done.callback(None)


async def open_tap(base: str, pattern: str, headers: dict[str, str] | None = None
                   ) -> tuple[Any, LineReader]:
    """An open tap's response and the reader of its lines."""
    from urllib.parse import quote

    request_headers = Headers({key.encode(): [value.encode()]
                               for key, value in (headers or {}).items()})
    response = await wait_for(Agent(reactor).request(
        b"GET", f"{base}/api/tap?pattern={quote(pattern, safe='')}".encode(), request_headers))
    reader = LineReader()
    response.deliverBody(reader)
    return response, reader
