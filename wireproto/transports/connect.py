"""One call to connect a message protocol to any address: WebSocket URL or Twisted endpoint string.

``ws://`` and ``wss://`` URLs connect over WebSocket (``wss`` verifies the server's certificate
unless given other TLS options). Anything else is a Twisted client endpoint string (``tcp:``,
``ssl:``, ``unix:``, ``serial:``) carrying a framed stream: ``cobs`` on serial links,
``length32`` elsewhere, unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, clientFromString, wrapClientTLS
from twisted.internet.ssl import optionsForClientTLS

from wireproto.redaction import redact_url
from wireproto.transports.base import IMessageProtocol
from wireproto.transports.websocket import WebSocketOptions, websocket_client_factory

if TYPE_CHECKING:
    from wireproto.devices.listing import PortListing
    from wireproto.devices.ports import PortLister
    from wireproto.transports.stream import StreamOptions

__all__ = [
    "client_endpoint",
    "split_endpoint",
    "tls_client_options",
    "connect",
    "default_framing",
    "is_websocket_address",
    "split_unix_url",
    "websocket_client",
]

WEBSOCKET_SCHEMES = ("ws://", "wss://", "ws+unix://")
UNIX_SCHEMES = ("ws+unix://", "http+unix://")  # as `wireproto serve` prints a unix listener
# Frozen, so one shared default is safe.
_DEFAULT_WEBSOCKET_OPTIONS = WebSocketOptions()


def split_endpoint(endpoint: str) -> tuple[list[str], dict[str, str]]:
    """Positional and keyword parts of an endpoint string, as Twisted reads it (`\\` escapes)."""
    parts: list[list[str]] = [[""]]
    escaped = False
    for char in endpoint:
        if escaped:
            parts[-1][-1] += char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            parts.append([""])
        elif char == "=" and len(parts[-1]) == 1:
            parts[-1].append("")
        else:
            parts[-1][-1] += char
    args = [part[0] for part in parts if len(part) == 1]
    kwargs = {part[0]: part[1] for part in parts if len(part) == 2}
    return args, kwargs


def tls_client_options(host: str, *, cafile: str | None = None, insecure: bool = False,
                       certfile: str | None = None, keyfile: str | None = None) -> Any:
    """TLS client options for `host`: its certificate verified against the system's trust roots,
    or against the certificates in `cafile` (PEM); `insecure` verifies nothing. `certfile`
    (PEM) is this client's own certificate, for a server that asks for one (``mtls:``), with
    its private key in `keyfile` or, without one, in `certfile` too."""
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509 import load_pem_x509_certificates
    from twisted.internet.ssl import (
        Certificate,
        CertificateOptions,
        PrivateCertificate,
        trustRootFromCertificates,
    )

    own = None
    if certfile is not None:
        try:
            own = PrivateCertificate.loadPEM(_read_pem(certfile)
                                             + (b"" if keyfile is None else _read_pem(keyfile)))
        except Exception as error:  # pyOpenSSL's errors say little: name the files instead
            raise ValueError(f"{certfile!r}{'' if keyfile is None else f' and {keyfile!r}'}: "
                             f"not a PEM certificate and its private key ({error})") from None
    elif keyfile is not None:
        raise ValueError("a private key file without its certificate file")
    if insecure:
        if own is None:
            return CertificateOptions()
        return CertificateOptions(privateKey=own.privateKey.original,
                                  certificate=own.original)
    if cafile is None:
        return optionsForClientTLS(host, clientCertificate=own)
    try:
        loaded = load_pem_x509_certificates(_read_pem(cafile))
    except ValueError:
        raise ValueError(f"{cafile!r} holds no PEM certificate") from None
    certificates = [Certificate.load(certificate.public_bytes(Encoding.DER))
                    for certificate in loaded]
    return optionsForClientTLS(host, trustRoot=trustRootFromCertificates(certificates),
                               clientCertificate=own)


def _read_pem(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _ssl_endpoint(reactor: Any, address: str, cafile: str | None, insecure: bool,
                  certfile: str | None = None, keyfile: str | None = None) -> Any:
    """An ``ssl:`` client endpoint that verifies the server unless told not to.

    Twisted's ``ssl:`` string verifies nothing without ``hostname=``; here `hostname` defaults
    to the host. ``verify=no`` in the string, or `insecure`, turns verification off; `cafile`
    (or Twisted's own ``caCertsDir=``) names whom to trust instead of the system's roots."""
    args, kwargs = split_endpoint(address)
    positional = args[1:]
    host = kwargs.get("host") or (positional[0] if positional else "")
    port = kwargs.get("port") or (positional[1] if len(positional) > 1 else "")
    verify = kwargs.pop("verify", "yes").lower()
    if verify not in ("yes", "no"):
        raise ValueError(f"verify={verify} in {address!r}: use verify=yes or verify=no")
    insecure = insecure or verify == "no"
    if not insecure and cafile is None and certfile is None:
        if "hostname" in kwargs:
            return clientFromString(reactor, address)
        return clientFromString(reactor, address + ":hostname=" + host.replace(":", "\\:"))
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} needs a host and a port")
    if {"certKey", "privateKey", "caCertsDir"} & set(kwargs):
        raise ValueError(f"{address!r}: certKey, privateKey and caCertsDir go without "
                         "verify=no, a CA file and a certificate file")
    options = tls_client_options(kwargs.get("hostname", host), cafile=cafile,
                                 insecure=insecure, certfile=certfile, keyfile=keyfile)
    return wrapClientTLS(options, HostnameEndpoint(reactor, host, int(port)))


def is_websocket_address(address: str) -> bool:
    """True for ``ws://``, ``wss://`` and ``ws+unix://`` URLs."""
    return address.lower().startswith(WEBSOCKET_SCHEMES)


def split_unix_url(address: str) -> tuple[str, str]:
    """A ``ws+unix://SOCKET:/PATH`` (or ``http+unix://``) address as the unix socket's path and
    the URL to ask for on it, ``ws://localhost/PATH`` (``http://...``)."""
    scheme, _, rest = address.partition("+unix://")
    socket, colon, path = rest.partition(":/")
    if not socket or not colon:
        raise ValueError(f"{address!r}: write a unix socket's URL as {scheme}+unix://SOCKET:/PATH")
    return socket, f"{scheme}://localhost/{path}"


def default_framing(address: str) -> str:
    """The framing a stream address gets when none is named: COBS on serial links."""
    return "cobs" if address.startswith("serial:") else "length32"


def client_endpoint(
    reactor: Any, address: str, *, cafile: str | None = None, insecure: bool = False,
    certfile: str | None = None, keyfile: str | None = None,
    ports: PortLister | PortListing | None = None,
) -> Any:
    """The Twisted client endpoint for a stream address, with a clear error for a bad one.
    `ports` lists the serial ports a ``serial:vid=...`` address is matched against, off the
    reactor's thread (the system's by default).

    ``serial:`` is parsed here as well as by the endpoint plugin, so connecting to a serial
    port does not depend on Twisted finding the plugin. ``ssl:`` verifies the server by default
    (see `_ssl_endpoint`).
    """
    try:
        if address.startswith("serial:"):
            from wireproto.transports.serial import serial_endpoint_from_string

            return serial_endpoint_from_string(reactor, address, ports)
        if address.lower().startswith("ssl:"):
            return _ssl_endpoint(reactor, address, cafile, insecure, certfile, keyfile)
        if cafile is not None or insecure or certfile is not None or keyfile is not None:
            raise ValueError("a CA file, a certificate file and insecure are for ssl: endpoints "
                             "and wss:// URLs")
        return clientFromString(reactor, address)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"cannot connect to {address!r}: {exc}. Use ws://host:port/path, wss://..., or an "
            "endpoint string such as tcp:host=127.0.0.1:port=9000, unix:path=/run/x.sock or "
            "serial:/dev/ttyACM0:baudrate=115200"
        ) from exc


def websocket_client(
    reactor: Any,
    address: str,
    protocol_factory: Callable[[], IMessageProtocol],
    websocket: WebSocketOptions = _DEFAULT_WEBSOCKET_OPTIONS,
    context_factory: Any = None,
    *,
    cafile: str | None = None,
    insecure: bool = False,
    headers: dict[str, str] | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
) -> tuple[Any, Any]:
    """The client endpoint and the Autobahn factory that connect to a ``ws://`` or ``wss://``
    `address`; each connection's message protocol is a new ``protocol_factory()``. `headers`
    go with the opening handshake; `cafile`, `insecure`, `certfile` and `keyfile` are as
    `tls_client_options`."""
    socket = None
    url = address
    if address.lower().startswith(UNIX_SCHEMES):
        socket, url = split_unix_url(address)
    try:
        factory = websocket_client_factory(_ascii_url(url), protocol_factory, websocket,
                                           reactor=reactor, headers=headers)
    except Exception as exc:  # Autobahn raises bare Exception for a bad URL
        raise ValueError(f"cannot connect to {redact_url(address)!r}: {exc}") from exc
    endpoint: Any = HostnameEndpoint(reactor, factory.host, factory.port)
    if socket is not None:
        from twisted.internet.endpoints import UNIXClientEndpoint

        endpoint = UNIXClientEndpoint(reactor, socket)
    if factory.isSecure:
        tls = context_factory if context_factory is not None else tls_client_options(
            factory.host, cafile=cafile, insecure=insecure, certfile=certfile, keyfile=keyfile
        )
        endpoint = wrapClientTLS(tls, endpoint)
    elif (context_factory is not None or cafile is not None or insecure
          or certfile is not None or keyfile is not None):
        raise ValueError(f"TLS options are for wss:// URLs, not {redact_url(address)!r}")
    return endpoint, factory


def _ascii_url(address: str) -> str:
    """`address` with its path and query percent-encoded where they are not ASCII, as a browser
    sends them: a request line is ASCII."""
    if address.isascii():
        return address
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(address)
    safe = "/%:@!$&'()*+,;=~-._?"
    return urlunsplit(parts._replace(path=quote(parts.path, safe=safe),
                                     query=quote(parts.query, safe=safe)))


Connected = TypeVar("Connected", bound=IMessageProtocol)


def connect(
    reactor: Any,
    address: str,
    protocol_factory: Callable[[], Connected],
    *,
    framing: str | None = None,
    websocket: WebSocketOptions = _DEFAULT_WEBSOCKET_OPTIONS,
    stream: StreamOptions | None = None,
    context_factory: Any = None,
    cafile: str | None = None,
    insecure: bool = False,
    headers: dict[str, str] | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
) -> Deferred[Connected]:
    """Connect a new ``protocol_factory()`` protocol to `address`.

    The Deferred fires with that protocol once it can send (after the WebSocket opening
    handshake for ws/wss), or fails with a clear error: ConnectionRefusedError,
    `HandshakeFailed`, `SerialOpenFailed`, a TLS verification error...

    `framing` (for stream addresses) overrides `stream.framing`. `context_factory` is the TLS
    client options for ``wss://``, e.g. ``optionsForClientTLS("host", trustRoot=...)``; the
    default verifies the server against the system's trust roots, or against `cafile`'s
    certificates (``wss://`` and ``ssl:``); `insecure` turns verification off. `certfile` and
    `keyfile` are this client's certificate and key for a server that asks for one. `headers`
    go with a WebSocket's opening handshake.
    """
    if is_websocket_address(address):
        if framing is not None or stream is not None:
            raise ValueError(f"{address!r} is a WebSocket URL: framing and stream do not apply")
        endpoint, factory = websocket_client(
            reactor, address, protocol_factory, websocket, context_factory,
            cafile=cafile, insecure=insecure, headers=headers, certfile=certfile,
            keyfile=keyfile,
        )
        opening = endpoint.connect(factory)
        opening.addCallback(lambda adapter: adapter.opened)
        return opening

    if context_factory is not None:
        raise ValueError(
            f"context_factory is for wss:// URLs; for TLS on a stream use an ssl: endpoint "
            f"string instead of {address!r}"
        )
    # Imported here: a WebSocket client needs no stream framing.
    from wireproto.transports.stream import StreamOptions, stream_client_factory

    if stream is None:
        stream = StreamOptions(framing=framing or default_framing(address))
    elif framing is not None:
        stream = replace(stream, framing=framing)
    if headers:
        raise ValueError(f"headers are for WebSocket URLs, not {redact_url(address)!r}")
    endpoint = client_endpoint(reactor, address, cafile=cafile, insecure=insecure,
                               certfile=certfile, keyfile=keyfile)
    connecting = endpoint.connect(stream_client_factory(protocol_factory, stream))
    connecting.addCallback(lambda adapter: adapter.wrapped)
    return connecting
