"""``wireproto pub`` and ``wireproto sub``: publish to and follow topics, as mosquitto_pub and
mosquitto_sub do, over WEBSMQ, UBRE, or Phyllo on a serial line (or TCP). See docs/tools.md.

    wireproto pub ws://127.0.0.1:8765/websmq -t sensors/temp -m 21.5
    wireproto sub ws://127.0.0.1:8765/ubre -t sensors/temp -C 1 --json
    wireproto pub serial:/dev/ttyACM0 -t led -m '{"on": true}'

Payloads: pub sends each stdin line (blank lines skipped) or -m as bytes over WEBSMQ; as a JSON
value over UBRE (the line as JSON if it parses, else as a string); as a msgpack document of that
value over Phyllo, or a 0x10 byte buffer with --bytes. sub prints ``TOPIC PAYLOAD``: a WEBSMQ
payload as it is, a UBRE body or a Phyllo document's value as its text if it is a string, else as
compact JSON; a payload that is not UTF-8 as ``base64:...``.

Timeouts: --timeout bounds connecting (and, for pub, closing); default 10 s. Given to sub, it
is the limit of the whole run, as mosquitto_sub -W: when it passes, sub exits 5 if -C's count has
not come, else 0 (without -C it is a listening window, as for ``wireproto events``). Ctrl-C or
SIGTERM ends either tool cleanly, with 0.
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

from wireproto.output import write_output
from wireproto.redaction import redact_text
from wireproto.tools._common import (
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ToolError,
    add_common_options,
    emit,
    payload_text,
    run_tool,
    stdin_lines,
)
from wireproto.tools.explain import ask_protocol, closed_line, explain_refusal
from wireproto.tools.habits import check_habits
from wireproto.tools.links import (
    NO_VALUE,
    Link,
    Received,
    close_link,
    open_link,
    reason_text,
)
from wireproto.tools.registry import links

__all__ = ["register"]

CLOSE_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 10.0


def SUB_RETRY(attempt: int) -> float:  # noqa: N802 - a policy, as Twisted's backoffPolicy makes
    """sub --reconnect: 1 s after the connection closes, then 2 s, 4 s ... 30 s at most, until
    an attempt connects."""
    return min(2.0 ** min(attempt, 100), 30.0)


# -- the run: ended once, by a count, a deadline, a lost connection or Ctrl-C --------------------


class _Ended(Exception):
    """The run ended while something was still awaited."""


class _Run:
    """Ends once, with an exit status or an exception for run_tool to report. (Ctrl-C and
    SIGTERM are run_tool's: they cancel what the tool waits for.)"""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.outcome: int | BaseException | None = None
        self._waiting: set[defer.Deferred] = set()
        self._timer: IDelayedCall | None = None

    def end(self, outcome: int | BaseException) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        for d in list(self._waiting):
            d.cancel()

    def end_after(self, seconds: float, outcome: Callable[[], int | BaseException]) -> None:
        self._timer = self.reactor.callLater(seconds, lambda: self.end(outcome()))

    async def wait(self, d: defer.Deferred) -> Any:
        """`d`'s result; if the run ends first, `d` is cancelled and this raises `_Ended`."""
        if self.outcome is not None:
            d.cancel()
            raise _Ended
        self._waiting.add(d)
        try:
            return await d
        except defer.CancelledError:
            if self.outcome is not None:
                raise _Ended from None
            raise
        finally:
            self._waiting.discard(d)

    async def until_ended(self) -> None:
        """Return once the run has ended."""
        if self.outcome is None:
            try:
                await self.wait(defer.Deferred())
            except _Ended:
                pass

    def result(self) -> int:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return EXIT_OK if self.outcome is None else self.outcome

    def release(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()


# -- pub -----------------------------------------------------------------------------------------


def pub(args: argparse.Namespace) -> int:
    async def main(reactor: Any) -> int:
        protocol = await ask_protocol(reactor, args, "pub", list(links()),
                                      args.timeout or DEFAULT_CONNECT_TIMEOUT)
        links()[protocol].check_topics([args.topic], patterns=False)
        run = _Run(reactor)
        link: Link | None = None
        try:
            whole = _whole_message(args)
            lines = stdin_lines(reactor) if whole is None else None
            link = await run.wait(open_link(
                reactor, args, links()[protocol], [args.topic], args.timeout).addErrback(
                lambda failure: explain_refusal(args, protocol, failure)))
            link.on_lost(lambda why: run.end(ToolError(
                closed_line(args.address, protocol, why)
                or f"the connection closed before every message was sent: {why}",
                EXIT_UNREACHABLE)))
            if whole is not None:
                await link.publish(args.topic, whole)
            else:
                assert lines is not None  # read from the start when there is no whole message
                while (line := await run.wait(lines.get())) is not None:
                    if line:  # as mosquitto_pub -l, blank lines are not sent
                        await link.publish(args.topic, line)
        except _Ended:
            pass
        finally:
            try:
                if link is not None:
                    closed = await close_link(link, reactor, args.timeout)
                    if closed is not None and run.outcome is None:
                        why = reason_text(closed)
                        run.end(ToolError(closed_line(args.address, protocol, why)
                                          or f"the connection closed badly: {why}"))
            finally:
                run.release()
        return run.result()

    return run_tool("pub", main, address=args.address)


def _whole_message(args: argparse.Namespace) -> bytes | None:
    """The one message -m, -f, -s or -n gives (as mosquitto_pub's); None for -l, a message per
    line of stdin (the default)."""
    if args.message is not None:
        # The bytes given, UTF-8 or not (Python keeps the others as surrogates).
        return args.message.encode("utf-8", "surrogateescape")
    if args.file is not None:
        try:
            with open(args.file, "rb") as file:
                return file.read()
        except OSError as error:
            raise ToolError(f"-f {args.file}: {error.strerror}", EXIT_USAGE) from None
    if args.stdin_whole:
        return sys.stdin.buffer.read() if sys.stdin is not None else b""
    if args.null:
        return b""
    return None


# -- sub -----------------------------------------------------------------------------------------


def sub(args: argparse.Namespace) -> int:
    topics: list[str] = args.topic
    if args.count is not None and args.count < 1:
        return _usage("sub", f"-C must be at least 1, not {args.count}")

    async def main(reactor: Any) -> int:
        from wireproto.topics import is_pattern

        protocol = await ask_protocol(reactor, args, "sub", list(links()),
                                      args.timeout or DEFAULT_CONNECT_TIMEOUT)
        links()[protocol].check_topics(topics, patterns=True)
        run = _Run(reactor)
        received = 0

        def timed_out() -> int | BaseException:
            if link is None:
                return ToolError(f"no connection to {args.address} within {args.timeout:g} s",
                                 EXIT_TIMEOUT)
            if args.count is None:
                return EXIT_OK  # a listening window: nothing more was asked for
            return ToolError(f"timed out: {received} of {args.count} messages within "
                             f"{args.timeout:g} s", EXIT_TIMEOUT)

        def deliver(message: Received) -> None:
            nonlocal received
            if run.outcome is not None:
                return
            received += 1
            _print(message, protocol, args.json, args.payload_only)
            if args.count is not None and received >= args.count:
                run.end(EXIT_OK)

        link: Link | None = None
        ever_connected = False

        def opened(new: Link) -> Link:
            nonlocal link, ever_connected
            link, ever_connected = new, True
            reconnector.connected()  # before anything can report it lost
            new.on_lost(lambda why: lost(new, why))
            new.subscribe(topics, deliver)
            return new

        def not_opened(reason: Failure) -> Failure:
            # The first connection must work; after it, --reconnect tries again as long as the
            # address cannot be reached (a ToolError), and anything else ends the run. (Cancelled:
            # the run is ending already.)
            if reason.check(defer.CancelledError):
                return reason
            if not ever_connected or not reason.check(ToolError):
                reconnector.stop()
                run.end(reason.value)
            return reason

        def open_once() -> defer.Deferred:
            return open_link(
                reactor, args, links()[protocol], topics, connect_timeout).addErrback(
                lambda failure: explain_refusal(args, protocol, failure)).addCallbacks(
                opened, not_opened)

        def lost(gone: Link, why: str) -> None:
            nonlocal link
            if gone is not link:
                return
            if args.reconnect:
                print(f"wireproto sub: the connection closed: {redact_text(why)}; connecting again",
                      file=sys.stderr, flush=True)
                link = None
                reconnector.lost()
                return
            hint = ""
            if protocol == "websmq" and any(map(is_pattern, topics)):
                hint = " (WEBSMQ wildcards need the broker's --wildcards)"
            run.end(ToolError(closed_line(args.address, protocol, why)
                              or f"the connection closed: {why}{hint}", EXIT_UNREACHABLE))

        from wireproto.transports.reconnect import Reconnector  # sub's alone: pub starts sooner

        connect_timeout = None if args.timeout is not None else DEFAULT_CONNECT_TIMEOUT
        reconnector: Reconnector = Reconnector(
            reactor, open_once, retry_policy=SUB_RETRY, what=args.address, log_retries=False)
        try:
            if args.timeout is not None:
                run.end_after(args.timeout, timed_out)
            reconnector.start()
            await run.until_ended()
        finally:
            reconnector.stop()
            try:
                if link is not None and not link.closing:
                    await close_link(link, reactor, CLOSE_TIMEOUT)
            finally:
                run.release()
        return run.result()

    return run_tool("sub", main, until_stopped=True, address=args.address)


def _print(message: Received, protocol: str, as_json: bool, payload_only: bool = False) -> None:
    if payload_only and not as_json:
        write_output(message.payload + b"\n", "wireproto sub")
        return
    record: dict[str, Any] = {"topic": message.topic}
    try:
        record["payload"] = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        record["payload_base64"] = base64.b64encode(message.payload).decode("ascii")
    record["protocol"] = protocol
    if message.value is not NO_VALUE:
        record["value"] = message.value
    if message.will:
        record["will"] = True
    emit(as_json, record, f"{message.topic} {payload_text(message.payload)}")


def _usage(tool: str, message: str) -> int:
    print(f"wireproto {tool}: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


# -- the command line ----------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Adds ``pub`` and ``sub``."""
    publish = commands.add_parser(
        "pub",
        help="publish messages (WEBSMQ, UBRE, Phyllo)",
        description="Publish -m MESSAGE, a whole -f FILE or -s stdin, -n an empty message, or -l "
                    "each line of stdin (the default), on TOPIC; exit 0 once every "
                    "message is written and the connection closed cleanly.",
        epilog="See docs/tools.md.",
    )
    add_common_options(publish, list(links()))
    _option(publish, "--timeout").help = "give up connecting or closing after this long " \
                                         "(default 10)"
    publish.add_argument("-t", "--topic", required=True, help="the topic to publish on")
    whole = publish.add_mutually_exclusive_group()
    whole.add_argument("-m", "--message", help="the one message to send")
    whole.add_argument("-f", "--file", metavar="FILE",
                       help="send the whole of FILE as one message")
    whole.add_argument("-s", "--stdin-whole", action="store_true",
                       help="send the whole of stdin as one message")
    whole.add_argument("-n", "--null", action="store_true", help="send one empty message")
    whole.add_argument("-l", "--lines", action="store_true",
                       help="send each line of stdin as a message (the default)")
    publish.add_argument("--bytes", action="store_true",
                         help="Phyllo: send a 0x10 byte buffer, not a msgpack document")
    publish.add_argument("--stack", choices=("minimal", "reduced"), default="reduced",
                         help="Phyllo: the device's stack (default reduced)")
    publish.set_defaults(run=pub)
    check_habits(publish, "pub", path="/websmq", one_topic="topic")

    follow = commands.add_parser(
        "sub",
        help="print messages on topics (WEBSMQ, UBRE, Phyllo)",
        description="Subscribe to each -t TOPIC and print each message as TOPIC PAYLOAD, "
                    "until -C COUNT messages, --timeout, or Ctrl-C.",
        epilog="See docs/tools.md.",
    )
    add_common_options(follow, list(links()))
    follow.set_defaults(timeout=None)
    _option(follow, "--timeout").help = (
        "stop after this long in all: exit 5 if fewer than COUNT messages came, else 0 "
        "(default: 10 s to connect, then no limit)"
    )
    follow.add_argument("-t", "--topic", action="append", required=True,
                        help="a topic to follow; repeatable. WEBSMQ and Phyllo take + and # "
                             "wildcards (WEBSMQ: if the broker runs with --wildcards)")
    follow.add_argument("-C", "--count", type=int, metavar="COUNT",
                        help="exit 0 after COUNT messages")
    follow.add_argument("--reconnect", action="store_true",
                        help="when the connection closes, connect again (1 s, 2 s ... 30 s "
                             "apart) and subscribe again, until Ctrl-C")
    follow.add_argument("--payload-only", action="store_true",
                        help="print only each message's payload, as it came (bytes too)")
    follow.add_argument("--stack", choices=("minimal", "reduced"), default="reduced",
                        help="Phyllo: the device's stack (default reduced)")
    follow.add_argument("-v", "--verbose", action="store_true",
                        help="print TOPIC PAYLOAD, the default (as mosquitto_sub -v)")
    follow.set_defaults(run=sub)
    check_habits(follow, "sub", path="/websmq")


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(action for action in parser._actions if flag in action.option_strings)
