"""``wireproto call``, ``produce`` and ``events``: one request, and SubbleSocket's events.

- ``call ADDRESS TOPIC_OR_PATH [DATA]`` sends one UBRE request (its name, a body) or one nydus
  INVOKE (a path, data) and prints the answer as one line of JSON;
- ``produce ADDRESS -t TYPE [-m DATA]`` produces SubbleSocket events (one, or one per stdin line)
  and waits for the host's echo of each;
- ``events ADDRESS -t TYPE...`` subscribes to event types in its handshake and prints each event.

DATA is JSON text; text that is not JSON is sent as a string. Exit codes: see `_common`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from twisted.internet import defer, error

from wireproto.codecs.serialization import json_dumps, json_parse
from wireproto.tools._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ToolError,
    add_common_options,
    connect_options,
    emit,
    one_line,
    payload_text,
    run_tool,
    stdin_lines,
)
from wireproto.tools.explain import ask_protocol, closed_line, refusal
from wireproto.tools.habits import check_habits
from wireproto.tools.registry import call_protocols, protocol_of

if TYPE_CHECKING:
    from wireproto.protocols.client import ClientBase
    from wireproto.protocols.subble.events import SubbleEvent

__all__ = [
    "register",
    "parse_data",
    "compact_json",
    "event_record",
]

SUBBLE_PROTOCOLS = ("subble",)
CONNECT_TIMEOUT = 10.0  # for `events`, whose --timeout is off unless given

# What a refused handshake's code means (SubbleSocket's codes 10, 11, 12 and 25).
HANDSHAKE_CODES = {
    10: "this address is not allowed",
    11: "the host does not give new client IDs",
    12: "the client ID is not in the host's registry",
    25: "handshake error",
}
EVENT_ERROR_CODES = {
    51: "event not declared",
    52: "the host did not create the event",
}

_NOTHING = object()  # a call without data


# -- values ---------------------------------------------------------------------------------------


def parse_data(text: str) -> Any:
    """DATA as a value: JSON text, or the text itself as a string when it is not JSON."""
    try:
        return json_parse(text)
    except ValueError:
        return text


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return payload_text(bytes(value))
    return str(value)


def compact_json(value: Any) -> str:
    """`value` as JSON on one line; bytes as their text (or ``base64:...``)."""
    return json_dumps(value, allow_nan=True, default=_json_default)


def _jsonable(value: Any) -> Any:
    return json_parse(compact_json(value))


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


async def _within(reactor: Any, d: defer.Deferred, seconds: float, what: str) -> Any:
    """`d`'s result, or a timeout ToolError after `seconds`."""
    d.addTimeout(seconds, reactor)
    try:
        return await d
    except (defer.TimeoutError, TimeoutError):
        raise ToolError(f"{what}: no answer within {seconds:g} s", EXIT_TIMEOUT) from None


def _check_address(reactor: Any, address: str) -> None:
    """Raise ValueError for an address no client can connect to, before a client tries: a
    client whose first attempt raises would leave a waiter behind."""
    from wireproto.transports.base import MessageProtocol
    from wireproto.transports.connect import (
        client_endpoint,
        is_websocket_address,
        websocket_client,
    )

    if is_websocket_address(address):
        websocket_client(reactor, address, MessageProtocol)  # made, never connected
    elif not address.lower().startswith(("http://", "https://", "http+unix://")):
        client_endpoint(reactor, address)


async def _connect(reactor: Any, client: ClientBase[Any], seconds: float, protocol: str,
                   args: argparse.Namespace) -> None:
    """Connect `client` (and handshake) within `seconds`, with the tools' errors: `client`
    speaks `protocol`, with what `args` give."""
    from wireproto.protocols.rpc import ConnectionClosed
    from wireproto.protocols.subble.client import HandshakeRefused
    from wireproto.transports.websocket import HandshakeFailed

    try:
        await _within(reactor, client.connect(), seconds, f"connecting to {client.address}")
    except HandshakeFailed as failed:
        raise refusal(args, protocol, failed) from None
    except HandshakeRefused as refused:
        code = int(refused.code)
        meaning = HANDSHAKE_CODES.get(code, "refused")
        detail = f" ({refused.message})" if refused.message else ""
        raise ToolError(
            one_line(f"{client.address}: handshake refused with {code}, {meaning}{detail}"),
            EXIT_REFUSED,
        ) from None
    except (error.ConnectError, error.DNSLookupError) as failed:
        reason = str(failed).strip() or type(failed).__name__
        if type(failed) is error.ConnectError and failed.args:
            reason = str(failed.args[0])  # Twisted's "An error occurred while connecting: 2: ..."
        raise ToolError(f"cannot connect to {client.address}: {reason}",
                        EXIT_UNREACHABLE) from None
    except (ConnectionClosed, error.ConnectionDone, error.ConnectionLost) as closed:
        raise ToolError(one_line(
            closed_line(args.address, protocol, str(closed), answered=False)
            or f"{client.address}: the connection closed: {closed}"), EXIT_UNREACHABLE) from None


async def _close(reactor: Any, client: ClientBase[Any]) -> None:
    """Close `client`, waiting a little for it; never raises."""
    try:
        d = client.close()
        d.addTimeout(2, reactor)
        await d
    except Exception:  # noqa: BLE001 - closing is best effort: we are leaving anyway
        pass


def _subble_protocol(args: argparse.Namespace) -> None:
    """Only SubbleSocket is spoken here: an endpoint string needs no --protocol."""
    given = args.protocol
    if given is None and "://" not in args.address:
        given = "subble"
    protocol_of(args.address, given, SUBBLE_PROTOCOLS)


def _stdin() -> IO[bytes] | None:
    stream = sys.stdin
    return None if stream is None else stream.buffer


# -- call -----------------------------------------------------------------------------------------


def _call_data(given: str | None) -> Any:
    """DATA from the command line, else stdin read whole when it is not a terminal."""
    if given is not None:
        return parse_data(given)
    stream = _stdin()
    if stream is None or sys.stdin.isatty():
        return _NOTHING
    try:
        text = stream.read().decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ToolError("stdin is not UTF-8 text", EXIT_USAGE) from None
    return parse_data(text) if text.strip() else _NOTHING


def _failure_text(failure: Exception) -> tuple[Any, str]:
    """What a failed call's peer said: as data (for --json) and as text."""
    from wireproto.protocols.nydus.server import InvokeError

    if isinstance(failure, InvokeError):
        data = failure.to_data()
        text = f"{failure.status} {failure.message}"
        if failure.body is not None:
            text += f": {compact_json(failure.body)}"
        return data, text
    body = getattr(failure, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        name = body.get("name")
        text = f"{name}: {body['message']}" if isinstance(name, str) else body["message"]
    else:
        text = compact_json(body)
    return body, text


async def _call(reactor: Any, args: argparse.Namespace) -> int:
    from wireproto.protocols.rpc import ConnectionClosed

    callers = call_protocols()
    timeout = args.timeout  # more than 0: _common.seconds
    assert timeout is not None
    protocol = await ask_protocol(reactor, args, "call", list(callers), timeout)
    data = _call_data(args.data)
    target = args.target
    _check_address(reactor, args.address)
    caller = callers[protocol](reactor, args.address, timeout, **connect_options(args))
    client = caller.client
    try:
        await _connect(reactor, client, timeout, protocol, args)
        started = time.monotonic()
        try:
            result = await caller.ask(target, None if data is _NOTHING else (data,), timeout)
        except TimeoutError:
            raise ToolError(f"{target}: no answer within {timeout:g} s", EXIT_TIMEOUT) from None
        except caller.failures as failed:
            said, text = _failure_text(failed)
            if args.json:
                emit(True, {"error": _jsonable(said), "ms": _ms(started)}, "")
            raise ToolError(one_line(f"{target} failed: {text}"), EXIT_FAILED) from None
        except ConnectionClosed as closed:
            raise ToolError(one_line(
                closed_line(args.address, protocol, str(closed), answered=False)
                or f"{target}: {closed}"), EXIT_UNREACHABLE) from None
        ms = _ms(started)
        emit(args.json, {"result": _jsonable(result), "ms": ms}, compact_json(result))
        return EXIT_OK
    finally:
        await _close(reactor, client)


# -- produce --------------------------------------------------------------------------------------


def event_record(event: SubbleEvent) -> dict[str, Any]:
    """A SubbleEvent as the JSON object ``events --json`` prints."""
    return {
        "type": event.type,
        "data": _jsonable(event.payload),
        "source": event.source,
        "id": event.guid,
        "time": event.datetime.isoformat().replace("+00:00", "Z"),
        "format": event.format.name.lower() if hasattr(event.format, "name")
        else int(event.format),
    }


def _event_text(payload: Any) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return payload_text(bytes(payload))
    return compact_json(payload)


def _subble_client(reactor: Any, args: argparse.Namespace, handshake_timeout: float,
                   **options: Any) -> Any:
    from wireproto.protocols.subble.client import SubbleClient

    try:
        _check_address(reactor, args.address)
        options.update(connect_options(args))
        return SubbleClient(reactor, args.address, client_id=args.client_id,
                            handshake_timeout=handshake_timeout, **options)
    except (TypeError, ValueError) as bad:
        raise ToolError(one_line(str(bad)), EXIT_USAGE) from None


async def _produce(reactor: Any, args: argparse.Namespace) -> int:
    from wireproto.protocols.rpc import ConnectionClosed
    from wireproto.protocols.subble.client import EventRefused

    _subble_protocol(args)
    timeout = args.timeout  # more than 0: _common.seconds
    assert timeout is not None
    event_type = args.event_type
    client = _subble_client(reactor, args, timeout, produce=[event_type])

    lines: defer.DeferredQueue | None = None
    if args.message is None:
        if _stdin() is None:
            raise ToolError("nothing to produce: give -m DATA or lines on stdin", EXIT_USAGE)
        lines = stdin_lines(reactor)
    try:
        await _connect(reactor, client, timeout, "subble", args)
        while True:
            if lines is None:
                text = args.message
            else:
                line = await lines.get()
                if line is None:
                    break
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError:
                    raise ToolError("a line on stdin is not UTF-8 text", EXIT_USAGE) from None
            try:
                echo = await client.produce(event_type, parse_data(text), format=args.format,
                                            timeout=timeout)
            except EventRefused as refused:
                code = int(refused.code)
                detail = f": {refused.message}" if refused.message else ""
                raise ToolError(one_line(
                    f"{event_type}: refused with {code}, {EVENT_ERROR_CODES[code]}{detail}"
                ), EXIT_FAILED) from None
            except TimeoutError:
                raise ToolError(f"{event_type}: no echo within {timeout:g} s",
                                EXIT_TIMEOUT) from None
            except ConnectionClosed as closed:
                raise ToolError(one_line(closed_line(args.address, "subble", str(closed))
                                         or f"{event_type}: {closed}"), EXIT_UNREACHABLE) from None
            if args.json:
                emit(True, event_record(echo), "")
            if lines is None:
                break
        return EXIT_OK
    finally:
        await _close(reactor, client)


# -- events ---------------------------------------------------------------------------------------


async def _events(reactor: Any, args: argparse.Namespace) -> int:
    _subble_protocol(args)
    timeout = args.timeout  # more than 0: _common.seconds
    count = args.count
    started = time.monotonic()
    done: defer.Deferred[int] = defer.Deferred()
    received = 0

    def on_event(event: SubbleEvent) -> None:
        nonlocal received
        if done.called:
            return
        emit(args.json, event_record(event), f"{event.type} {_event_text(event.payload)}")
        received += 1
        if count is not None and received >= count:
            done.callback(EXIT_OK)

    def end(result: int | ToolError) -> None:
        if done.called:
            return
        if isinstance(result, ToolError):
            done.errback(result)
        else:
            done.callback(result)

    connect_timeout = timeout or CONNECT_TIMEOUT
    client = _subble_client(reactor, args, connect_timeout, subscribe=args.event_types,
                            on_event=on_event)
    client.on_disconnect = lambda reason: end(ToolError(one_line(
        closed_line(args.address, "subble", reason.getErrorMessage())
        or f"{args.address}: the connection closed: {reason.getErrorMessage()}"),
        EXIT_UNREACHABLE,
    ))

    timer = None
    try:
        await _connect(reactor, client, connect_timeout, "subble", args)
        if done.called:
            return await done
        if timeout is not None:
            def expired() -> None:
                if count is None:
                    end(EXIT_OK)  # listened as long as asked
                else:
                    end(ToolError(f"{received} of {count} events within {timeout:g} s",
                                  EXIT_TIMEOUT))

            timer = reactor.callLater(max(0.0, timeout - (time.monotonic() - started)), expired)
        return await done
    finally:
        if timer is not None and timer.active():
            timer.cancel()
        await _close(reactor, client)


# -- the subcommands ------------------------------------------------------------------------------


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _runner(name: str, main: Callable[[Any, argparse.Namespace], Any], *,
            until_stopped: bool = False) -> Callable[..., int]:
    return lambda args: run_tool(name, lambda reactor: main(reactor, args),
                                 until_stopped=until_stopped, address=args.address)


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``call``, ``produce`` and ``events``."""
    call = commands.add_parser(
        "call",
        help="send one UBRE request or nydus invoke and print the answer",
        description="Send one UBRE request (TOPIC_OR_PATH is the handler's name) or one nydus "
                    "INVOKE (a path), and print the answer as one line of JSON. DATA is JSON "
                    "text (text that is not JSON is a string); without DATA, stdin is read "
                    "whole unless it is a terminal. A failed call exits 1.",
    )
    add_common_options(call, list(call_protocols()))
    call.add_argument("target", metavar="TOPIC_OR_PATH",
                      help="the UBRE request's name, or the nydus path")
    call.add_argument("data", metavar="DATA", nargs="?",
                      help="the request's body or the invoke's data, as JSON")
    call.set_defaults(run=_runner("call", _call))
    check_habits(call, "call", path="/ubre")

    produce = commands.add_parser(
        "produce",
        help="produce SubbleSocket events",
        description="Produce a SubbleSocket event of TYPE (declared in the handshake) and wait "
                    "for the host's echo; without -m, one event per line of stdin. DATA is JSON "
                    "text (text that is not JSON is a string). A refused event exits 1.",
    )
    add_common_options(produce, SUBBLE_PROTOCOLS)
    produce.add_argument("-t", "--type", dest="event_type", required=True, metavar="TYPE",
                         help="the event type")
    produce.add_argument("-m", "--message", metavar="DATA", help="the event's data")
    produce.add_argument("--format", choices=("msgpack", "json"), default="msgpack",
                         help="the payload's serialization (default msgpack)")
    produce.add_argument("--client-id", metavar="ID",
                         help="the client ID to handshake with (default: a new one)")
    produce.set_defaults(run=_runner("produce", _produce))
    check_habits(produce, "produce", path="/subble", one_topic="event type")

    events = commands.add_parser(
        "events",
        help="print SubbleSocket events",
        description="Subscribe to SubbleSocket event types in the handshake and print each "
                    "event as TYPE DATA (or a JSON object with --json) until Ctrl-C, -C COUNT "
                    "events, or --timeout.",
    )
    add_common_options(events, SUBBLE_PROTOCOLS)
    events.set_defaults(timeout=None)
    for action in events._actions:
        if action.dest == "timeout":
            action.help = ("stop after this long: exit 5 if -C COUNT events have not come, "
                           "else 0 (default: no limit)")
    events.add_argument("-t", "--type", dest="event_types", action="append", required=True,
                        metavar="TYPE", help="an event type to subscribe to (repeatable)")
    events.add_argument("-C", "--count", type=_count, metavar="COUNT",
                        help="exit after COUNT events")
    events.add_argument("--client-id", metavar="ID",
                        help="the client ID to handshake with (default: a new one)")
    events.set_defaults(run=_runner("events", _events, until_stopped=True))
    check_habits(events, "events", path="/subble")
