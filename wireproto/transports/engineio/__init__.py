"""Message transport over Engine.IO protocol 4: the server, as a twisted.web resource.

Implements Engine.IO 4 as the engine.io 6 server and engine.io-client 6 speak it, described in
docs/nydus.md, "Engine.IO 4" (from a wire capture); the packets are in
`wireproto.codecs.engineio`. nydus runs over it, and so can any other message protocol.

Server (`engineio_resource`, mounted at ``/engine.io/``):

- The handshake ``GET /engine.io/?EIO=4&transport=polling`` is answered with the open packet
  ``0{"sid":..,"upgrades":["websocket"],"pingInterval":..,"pingTimeout":..,"maxPayload":..}``.
- HTTP long-polling: a GET is held until a packet is queued, and answers every queued packet,
  joined by U+001E; a second GET while one is held closes the session, as in engine.io. A POST
  body is a payload of packets, answered ``ok``.
- The upgrade: a WebSocket with ``transport=websocket&sid=..``, the client's ``2probe``
  answered ``3probe``, the held GET released with a noop ``6``, then the client's ``5``
  moves the session to the WebSocket, which gets whatever was queued meanwhile.
- A WebSocket with no sid is a session of its own; its first frame is the open packet, with
  ``"upgrades":[]``.
- The server pings (``2``) every ping_interval and closes a session whose pong (``3``) does not
  come within ping_timeout. A close packet (``1``) from the client ends the session.
- max_payload caps a POST body (413) and a WebSocket frame (close code 1009), like engine.io's
  maxHttpBufferSize; the session that sent it is closed. Past max_connections sessions a
  handshake gets 503; `allow_request` may refuse a handshake with 403.
- Refusals carry engine.io's JSON error bodies, ``{"code":N,"message":..}``: 0 unknown transport,
  1 unknown sid, 2 bad handshake method, 3 bad request, 4 forbidden, 5 unsupported protocol
  version. Where engine.io answers a refused WebSocket with a bare 400, this answers as for
  polling (403 for a refused handshake).

Each session is one `IMessageTransport` (`EngineIOSession`) for one protocol made by
``protocol_factory()`` at the handshake. A polling session's queue pauses a registered producer
above `EngineIOOptions.poll_high_water` bytes and resumes it once a GET has taken them. A text
message cannot hold U+001E, which would split it in a polling payload: sending one raises
InvalidField. Served by `websocket_site` (a `wireproto.transports.http.GuardedSite`), a POST
body over max_payload is refused with 413 before it is read; on a plain twisted.web Site it is
read whole first, and refused (413) only once it is in.

The client is `wireproto.transports.engineio.client` (`engineio_client_connect`).

`EngineIOOptions.allowed_origins` checks the Origin header of each handshake, polling or
WebSocket, with the patterns `WebSocketOptions.allowed_origins` takes: a browser on a page of
another origin gets 403, with a ``wireproto-refused: origin`` header (engine.io's body is the
same for every refusal). A request without an Origin header (not from a browser) is let through.
engine.io has no such check; `allow_request` may add others. A page of an allowed origin may
read its polls (CORS, as engine.io's cors option); without `allowed_origins` no CORS header is
sent, as engine.io sends none without that option.

Several processes may share one listener (`wireproto serve --workers N`): with `owners`, a
server marks the sids it makes, and passes a request for another one's session to that one
(`handover`).

Not handled: cookies, JSONP, Engine.IO 3, WebTransport.

The package is split as python-engineio splits its server:

- `options`: `EngineIOOptions` and engine.io's names for transports and refusals;
- `packets`: packets ready for either carrier;
- `state`: a session's state machine, sans-IO: its life (`SessionState`), its carrier
  (`CarrierState`) and the transition table;
- `session`: `EngineIOSession`, the message transport, the upgrade and the end; the one module
  that moves a session's state;
- `heartbeat`: the server's pings of one session;
- `polling`: `PollingCarrier`, a session's long-polling, and engine.io's HTTP answers;
- `websocket`: `ServerWebSocket`, the server's WebSockets, each made for its request;
- `server`: the sessions, the handshake, request routing and the twisted.web resource;
- `handover`: the sessions of other processes that share the listener (`SessionOwners`), to
  which their requests are passed;
- `client`: the client role, over polling then WebSocket.
"""

from wireproto.transports.engineio.client import (
    EngineIOClientAdapter,
    engineio_client_connect,
    engineio_url,
)
from wireproto.transports.engineio.options import DEFAULT_PATH, POLLING, WEBSOCKET, EngineIOOptions
from wireproto.transports.engineio.server import engineio_resource
from wireproto.transports.engineio.session import EngineIOSession
from wireproto.transports.engineio.state import SessionState

__all__ = [
    "DEFAULT_PATH",
    "POLLING",
    "WEBSOCKET",
    "EngineIOOptions",
    "EngineIOSession",
    "SessionState",
    "EngineIOClientAdapter",
    "engineio_resource",
    "engineio_client_connect",
    "engineio_url",
]
