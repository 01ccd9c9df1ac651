"""Serial ports as Twisted client endpoints, so a serial link is just another stream.

`SerialEndpoint` opens a port with `twisted.internet.serialport.SerialPort` (over pyserial) and
connects any protocol factory to it; `stream_client_factory` with the ``cobs`` framing turns it
into a message transport. The ``serial:`` endpoint string (registered by
``twisted/plugins/wireproto_endpoints.py``) builds one::

    clientFromString(reactor, "serial:/dev/ttyACM0:baudrate=115200")
    clientFromString(reactor, "serial:device=/dev/ttyACM0:baudrate=115200:rtscts=yes")
    clientFromString(reactor, "serial:vid=2341:pid=0043:baudrate=115200")

The last finds the board by its USB identity (`wireproto.devices.matching`) each time it opens,
so a board plugged back in as another ``/dev/ttyACMn`` is found again: from a listing of the ports
made for that open, off the reactor's thread (`wireproto.devices.listing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import serial
from twisted.internet import defer
from twisted.internet.error import ConnectError, ConnectionAborted
from twisted.internet.interfaces import (
    IAddress,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
    IStreamClientEndpointStringParserWithReactor,
)
from twisted.internet.serialport import SerialPort
from twisted.plugin import IPlugin
from twisted.python.failure import Failure
from zope.interface import implementer

from wireproto.devices.listing import PortListing
from wireproto.devices.matching import MATCH_KEYS, PortMatch, resolve
from wireproto.devices.ports import PortInfo, PortLister, system_ports

__all__ = [
    "SerialAddress",
    "SerialEndpoint",
    "SerialOpenFailed",
    "SerialEndpointParser",
    "serial_endpoint_from_string",
    "split_fields",
]

BYTESIZES = (5, 6, 7, 8)
MAX_BAUDRATE = 2**31 - 1
PARITIES = ("N", "E", "O", "M", "S")
STOPBITS = (1, 1.5, 2)


@implementer(IAddress)
@dataclass(frozen=True)
class SerialAddress:
    """The address of a serial port: its device name. `type` follows Twisted's IPv4Address."""

    device: str
    type: str = "SERIAL"


class SerialOpenFailed(ConnectError):
    """Cannot open serial port"""


class _ExclusiveSerial(serial.Serial):
    """pyserial's port, locked (flock, as pyserial's ``exclusive`` takes it) when it opens."""

    def open(self) -> None:
        self.exclusive = True
        super().open()


class _SerialTransport(SerialPort):
    """Twisted's SerialPort with the addresses and abortConnection a message transport needs,
    opening its port exclusively (an advisory lock, as pyserial takes it): two readers of one
    port, two links matching one board or two brokers, would each get part of its bytes."""

    _serialFactory = _ExclusiveSerial

    def __init__(self, protocol: Any, device: str, reactor: Any, **settings: Any) -> None:
        # Set first: SerialPort.__init__ connects the protocol, which may ask for the address.
        self._address = SerialAddress(device)
        self._clock: IReactorTime = reactor  # SerialPort's own `reactor` is typed for its fds
        super().__init__(protocol, device, reactor, **settings)

    def getHost(self) -> SerialAddress:
        return self._address

    def getPeer(self) -> SerialAddress:
        return self._address

    def abortConnection(self) -> None:
        """Close at once, dropping what is still buffered (as TCP's abortConnection does)."""
        if not self.connected or getattr(self, "_aborting", False):
            return
        self._aborting = True
        self.stopReading()
        self.stopWriting()
        self.dataBuffer = b""
        self._tempDataBuffer = []
        self._tempDataLen = 0
        self._clock.callLater(0, self.connectionLost, Failure(ConnectionAborted()))


@implementer(IStreamClientEndpoint)
class SerialEndpoint:
    """A serial port as a client endpoint (8N1 at 115200 baud unless told otherwise): the port
    `device`, or the one port that `match` finds among those `lister` lists when it opens (a
    `PortListing` shared with others, or a lister this endpoint lists through one of its
    own)."""

    def __init__(
        self,
        reactor: Any,
        device: str | None = None,
        baudrate: int = 115200,
        bytesize: int = 8,
        parity: str = "N",
        stopbits: float = 1,
        xonxoff: bool = False,
        rtscts: bool = False,
        *,
        match: PortMatch | None = None,
        lister: PortLister | PortListing | None = None,
    ) -> None:
        if device and match is not None:
            raise ValueError(
                f"a serial endpoint takes a device or identity fields ({match.describe()}), "
                "not both")
        if not device and match is None:
            raise ValueError("a serial endpoint needs a device, e.g. serial:/dev/ttyACM0, or "
                             "identity fields, e.g. serial:vid=2341:pid=0043")
        if not isinstance(baudrate, int) or baudrate <= 0:
            raise ValueError(f"serial baudrate must be a positive integer, not {baudrate!r}")
        if baudrate > MAX_BAUDRATE:  # termios takes a C int: more fails each open
            raise ValueError(f"serial baudrate must be at most {MAX_BAUDRATE}, not {baudrate}")
        if bytesize not in BYTESIZES:
            raise ValueError(f"serial bytesize must be one of {BYTESIZES}, not {bytesize!r}")
        if parity not in PARITIES:
            raise ValueError(f"serial parity must be one of {PARITIES}, not {parity!r}")
        if stopbits not in STOPBITS:
            raise ValueError(f"serial stopbits must be one of {STOPBITS}, not {stopbits!r}")
        self.reactor = reactor
        self.device = device
        self.match = match
        self.listing = lister if isinstance(lister, PortListing) else PortListing(
            reactor, lister or system_ports)
        self.lister: PortLister = self.listing.lister
        # The port the last open found by `match`, for whoever reports on the board.
        self.port: PortInfo | None = None
        self.settings = {
            "baudrate": baudrate,
            "bytesize": bytesize,
            "parity": parity,
            "stopbits": stopbits,
            "xonxoff": bool(xonxoff),
            "rtscts": bool(rtscts),
        }

    def __repr__(self) -> str:
        where = repr(self.device) if self.match is None else self.match.describe()
        return f"SerialEndpoint({where}, baudrate={self.settings['baudrate']})"

    def connect(self, protocolFactory: IProtocolFactory) -> defer.Deferred:
        """Open the port (once the ports are listed, for one found by identity); the Deferred
        fires with the connected protocol. A match that finds no port, or several, fails with
        NoMatchingPort or SeveralMatchingPorts, naming what was asked and found; ports that
        cannot be listed, with PortsNotListed."""
        match = self.match
        if match is None:
            assert self.device
            return defer.maybeDeferred(self._open, protocolFactory, self.device)

        def found(ports: list[PortInfo]) -> object:
            self.port = resolve(match, ports)
            return self._open(protocolFactory, self.port.device)

        return self.listing.fresh().addCallback(found)

    def _open(self, protocolFactory: IProtocolFactory, device: str) -> object:
        protocol = protocolFactory.buildProtocol(SerialAddress(device))
        if protocol is None:
            raise SerialOpenFailed(string=f"{device}: the protocol factory refused to connect")
        try:
            _SerialTransport(protocol, device, self.reactor, **self.settings)
        except (serial.SerialException, OSError, ValueError, OverflowError) as exc:
            if "exclusively lock" in str(exc):
                raise SerialOpenFailed(
                    string=f"{device} is in use: another link or process has it open") from None
            raise SerialOpenFailed(string=f"{device}: {exc}") from None
        return protocol


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"serial {name} must be yes or no (1/0, true/false), not {value!r}")


def _number(name: str, value: str, convert: Any) -> Any:
    try:
        return convert(value)
    except ValueError:
        raise ValueError(f"serial {name} must be a number, not {value!r}") from None


def _endpoint_from_args(
    reactor: Any, args: tuple[str, ...], kwargs: dict[str, str],
    lister: PortLister | PortListing | None = None,
) -> SerialEndpoint:
    kwargs = dict(kwargs)
    device = kwargs.pop("device", None)
    identity = {key: kwargs.pop(key) for key in MATCH_KEYS if key in kwargs}
    if args:
        if device is not None or len(args) > 1:
            raise ValueError(f"serial: give the device once, got {(*args, device)}")
        device = args[0]
    settings: dict[str, Any] = {}
    if "baudrate" in kwargs:
        settings["baudrate"] = _number("baudrate", kwargs.pop("baudrate"), int)
    if "bytesize" in kwargs:
        settings["bytesize"] = _number("bytesize", kwargs.pop("bytesize"), int)
    if "parity" in kwargs:
        settings["parity"] = kwargs.pop("parity").upper()
    if "stopbits" in kwargs:
        stopbits = _number("stopbits", kwargs.pop("stopbits"), float)
        settings["stopbits"] = int(stopbits) if stopbits.is_integer() else stopbits
    for name in ("xonxoff", "rtscts"):
        if name in kwargs:
            settings[name] = _flag(name, kwargs.pop(name))
    if kwargs:
        raise ValueError(
            f"unknown serial endpoint option(s) {', '.join(sorted(kwargs))}: use baudrate, "
            f"bytesize, parity, stopbits, xonxoff, rtscts, or identity fields "
            f"{', '.join(MATCH_KEYS)}"
        )
    match = PortMatch.from_options(identity) if identity else None
    return SerialEndpoint(reactor, device or None, **settings, match=match, lister=lister)


def split_fields(description: str) -> list[str]:
    """Split an endpoint string on ':' the way Twisted does, honouring backslash escapes; in
    order, a key given twice kept twice."""
    fields: list[str] = []
    current: list[str] = []
    escaped = False
    for char in description:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    fields.append("".join(current))
    return fields


def serial_endpoint_from_string(reactor: Any, description: str,
                                lister: PortLister | PortListing | None = None
                                ) -> SerialEndpoint:
    """Parse ``serial:DEVICE[:key=value...]`` or ``serial:vid=...[:key=value...]`` without
    needing Twisted's plugin discovery; `lister` lists the ports identity fields are matched
    against (the system's by default)."""
    prefix, *fields = split_fields(description)
    if prefix != "serial":
        raise ValueError(f"not a serial endpoint string: {description!r}")
    args: list[str] = []
    kwargs: dict[str, str] = {}
    for field in fields:
        key, equals, value = field.partition("=")
        if equals:
            if key in kwargs:  # which one a link would use is not for a parser to guess
                raise ValueError(f"serial {key} is given twice")
            kwargs[key] = value
        else:
            args.append(field)
    return _endpoint_from_args(reactor, tuple(args), kwargs, lister)


@implementer(IPlugin, IStreamClientEndpointStringParserWithReactor)
class SerialEndpointParser:
    """The ``serial:`` prefix for `twisted.internet.endpoints.clientFromString`."""

    prefix = "serial"

    def parseStreamClient(self, reactor: Any, *args: object, **kwargs: object) -> SerialEndpoint:
        # the endpoint string's fields, which Twisted hands over as str
        return _endpoint_from_args(reactor, tuple(map(str, args)),
                                   {key: str(value) for key, value in kwargs.items()})
