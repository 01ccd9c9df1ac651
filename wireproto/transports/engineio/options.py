"""Engine.IO server settings and the names engine.io gives its transports and refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from autobahn.websocket.protocol import WebSocketProtocol
from twisted.web.iweb import IRequest

from wireproto.codecs.engineio import (
    Handshake,
)
from wireproto.settings import setting
from wireproto.transports.websocket import (
    WebSocketOptions,
)

__all__ = [
    "POLLING",
    "WEBSOCKET",
    "DEFAULT_PATH",
    "ERROR_MESSAGES",
    "EngineIOOptions",
]

POLLING = "polling"
WEBSOCKET = "websocket"
DEFAULT_PATH = "/engine.io/"

# engine.io's Server.errors and Server.errorMessages.
UNKNOWN_TRANSPORT = 0
UNKNOWN_SID = 1
BAD_HANDSHAKE_METHOD = 2
BAD_REQUEST = 3
FORBIDDEN = 4
UNSUPPORTED_PROTOCOL_VERSION = 5
ERROR_MESSAGES = {
    UNKNOWN_TRANSPORT: "Transport unknown",
    UNKNOWN_SID: "Session ID unknown",
    BAD_HANDSHAKE_METHOD: "Bad handshake method",
    BAD_REQUEST: "Bad request",
    FORBIDDEN: "Forbidden",
    UNSUPPORTED_PROTOCOL_VERSION: "Unsupported protocol version",
}

CLOSE_NORMAL = WebSocketProtocol.CLOSE_STATUS_CODE_NORMAL
CLOSE_PROTOCOL_ERROR = WebSocketProtocol.CLOSE_STATUS_CODE_PROTOCOL_ERROR
CLOSE_POLICY_VIOLATION = WebSocketProtocol.CLOSE_STATUS_CODE_POLICY_VIOLATION
CLOSE_TOO_BIG = WebSocketProtocol.CLOSE_STATUS_CODE_MESSAGE_TOO_BIG


@dataclass(frozen=True)
class EngineIOOptions:
    """Settings for Engine.IO servers; the defaults are engine.io 6's. Times are in seconds.
    The [engineio] table holds those a config file may set; the broker takes the origins and
    the WebSocket settings from [websocket].

    The client uses only `websocket`: its ping timing comes from the server's open packet.
    """

    ping_interval: float = 25.0
    ping_timeout: float = 20.0
    # Caps a POST body and a WebSocket frame, in bytes (engine.io's maxHttpBufferSize).
    max_payload: int = 1_000_000
    # Offer the upgrade from polling to WebSocket in the handshake.
    upgrades: bool = setting(True, in_config=False)
    # Open sessions at once, polling or WebSocket; a handshake past it gets 503...
    max_connections: int = 10_000
    # ...and past this many open sessions from the handshake's address.
    max_sessions_per_address: int = 100
    # A polling session that makes no request (GET, POST or upgrade) this soon after its
    # handshake is dropped, and frees its slot at once.
    first_request_timeout: float = 10.0
    # Called with the twisted.web request of each handshake (polling GET or WebSocket without a
    # sid); False refuses it with 403.
    allow_request: Callable[[IRequest], bool] | None = setting(None, in_config=False)
    # None accepts any Origin; else patterns matched against "scheme://host:port", as
    # WebSocketOptions.allowed_origins (the broker passes those).
    allowed_origins: tuple[str, ...] | None = setting(None, in_config=False)
    # For the WebSockets. Its max_message_size is raised to max_payload if it is lower.
    websocket: WebSocketOptions = setting(default_factory=WebSocketOptions, in_config=False)
    # A WebSocket that has not finished the upgrade dance by then is closed (engine.io's).
    upgrade_timeout: float = setting(10.0, in_config=False)
    # Queued bytes waiting for a polling GET above which a registered producer is paused...
    poll_high_water: int = setting(1_048_576, in_config=False)
    # ...and above which the session is closed (a poller that does not poll, no producer).
    max_poll_buffer: int = setting(16_777_216, in_config=False)

    def __post_init__(self) -> None:
        for name in ("ping_interval", "ping_timeout", "upgrade_timeout", "first_request_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("max_payload", "max_connections", "max_sessions_per_address",
                     "poll_high_water", "max_poll_buffer"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.websocket.max_message_size < self.max_payload:
            object.__setattr__(
                self, "websocket", replace(self.websocket, max_message_size=self.max_payload)
            )

    def _handshake(self, sid: str, upgrades: tuple[str, ...]) -> Handshake:
        return Handshake(
            sid,
            upgrades,
            round(self.ping_interval * 1000),
            round(self.ping_timeout * 1000),
            self.max_payload,
        )
