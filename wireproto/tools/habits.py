"""mosquitto_pub's and mosquitto_sub's options, caught before argparse reads them.

Several of their letters mean something else here (``-h`` is --help, ``-p`` is --protocol), and
argparse would take them silently: ``pub -h 127.0.0.1 ...`` printed the help and exited 0,
having published nothing. `foreign_habit` reads a tool's arguments as mosquitto would and
names the first option that would be misread, or that only mosquitto has, with one line that
says the wireproto way; `check_habits` makes a tool's parser exit 2 with that line first.
`-u USER` is taken with mosquitto's meaning (it is --user). See docs/tools.md, "Coming from
mosquitto".

Only the standard library: this runs on every start of a tool.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

__all__ = ["check_habits", "foreign_habit"]

DEFAULT_PORT = 8765  # wireproto serve's WebSocket port

# mosquitto options that take a value, by their long names too, for reading an argument list as
# mosquitto_pub or mosquitto_sub would.
_HOST = ("-h", "--host")
_PORT = ("-p", "--port")

# mosquitto's options that wireproto's tools do not have, with what to do instead. {tool} and
# {address} are filled in; no line repeats the value given (it may be a secret: -P, -L).
_ONLY_MOSQUITTO: dict[tuple[str, ...], str] = {
    ("-P", "--pw"): "a password on the command line shows in the process list: give --user "
                    "USER (or -u) and the password in $WIREPROTO_PASSWORD",
    ("--username",): "the user is --user USER (or -u), its password in $WIREPROTO_PASSWORD",
    ("-r", "--retain"): "{tool} has no retain flag: the broker keeps the last message of the "
                        "topics its [hub] retain patterns match, for later subscribers",
    ("-q", "--qos"): "{tool} has no QoS levels: it exits 0 only once every message is "
                     "written and the connection closed cleanly",  # (sub, events: _RECEIVERS)
    ("-k", "--keepalive"): "{tool} has no keepalive option: the broker pings WebSocket "
                           "clients ([websocket] auto_ping_interval)",
    ("-d", "--debug"): "{tool} has no debug output: errors are one line on stderr, and the "
                       "broker logs connections with wireproto serve -v",
    ("-V", "--protocol-version"): "the protocol is the ADDRESS's path (/websmq, /ubre) or "
                                  "-p/--protocol PROTOCOL",
    ("-W",): "the time limit is --timeout SECONDS (as mosquitto_sub -W)",
    ("-c", "--disable-clean-session"): "{tool} has no sessions to keep: each connection "
                                       "starts afresh",
}
_CLIENT_ID = ("-i", "--id", "-I", "--id-prefix")
# The tools that receive rather than send: -q means something else to them.
_RECEIVERS = ("sub", "events")
_ONE_VALUE = ("-P", "--pw", "--username", "-q", "--qos", "-k", "--keepalive", "-V",
              "--protocol-version", "-L", "--url", "-W", "-i", "--id", "-I", "--id-prefix")


def _readings(argv: Sequence[str],
              takes_value: Callable[[str], bool]) -> list[tuple[str, str | None]]:
    """Each option of `argv` with its value (None if it takes none), as mosquitto reads them:
    ``-h`` and ``-p`` take one whatever wireproto makes of them."""
    found: list[tuple[str, str | None]] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-" or word[1:2].isdigit():
            continue  # a positional, or a negative number
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            inline = value if equals else None
        else:
            name, rest = word[:2], word[2:]
            inline = rest or None
            if name in _HOST and inline is not None and not _looks_like_host(inline):
                # -hv is a cluster of short options (argparse: --help), not the host "v":
                # mosquitto takes its host only as the next word.
                found.append((name, None))
                continue
        if name in (*_HOST, *_PORT, *_ONE_VALUE) or takes_value(name):
            if inline is None and index < len(argv) and not (
                    argv[index].startswith("-") and len(argv[index]) > 1
                    and not argv[index][1:2].isdigit()):
                inline = argv[index]
                index += 1
            found.append((name, inline))
        else:
            found.append((name, None))
    return found


def _help_cluster(words: Sequence[str]) -> bool:
    """Whether `words` ask for the help in a cluster of short options (-hv, -vh), which
    argparse would refuse where a letter is no option of the tool; -h with a host attached
    (-h127.0.0.1) is mosquitto's host instead."""
    for word in words:
        if word == "--":
            return False
        if (word.startswith("-") and not word.startswith("--") and len(word) > 2
                and "h" in word[1:] and word[1:].isalpha()
                and not (word.startswith("-h") and _looks_like_host(word[2:]))):
            return True
    return False


def _looks_like_host(text: str) -> bool:
    """Whether -h's attached text (-h127.0.0.1) names a host rather than more short options."""
    return "." in text or ":" in text or text[:1].isdigit() or text == "localhost"


def _address(host: str | None, port: str | None, path: str) -> str:
    host = host or "127.0.0.1"
    if "://" in host or host.startswith(("tcp:", "ssl:", "unix:", "serial:")):
        return host  # an ADDRESS already
    return f"ws://{host}:{port or DEFAULT_PORT}{path}"


def _from_url(url: str | None, path: str) -> str:
    """What -L's mqtt://[user[:password]@]host[:port]/topic is here (its credentials left
    out: they would be shown)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url or "")
        host, port, topic = parts.hostname, parts.port, parts.path.lstrip("/")
    except ValueError:
        host, port, topic = None, None, ""
    address = _address(host, str(port) if port else None, path)
    return f"give the broker as the ADDRESS ({address}) and the topic with -t " + (
        topic or "TOPIC")


def foreign_habit(tool: str, argv: Sequence[str], *, path: str, protocols: Sequence[str],
                  one_topic: str | None = None,
                  takes_value: Callable[[str], bool] = lambda name: False) -> str | None:
    """The one line for the first mosquitto habit in `argv` that `tool` would misread or does
    not have, or None. `path` is the tool's usual ADDRESS path (/websmq), `protocols` what its
    -p takes; `one_topic` names, for a tool that takes -t once, what -t is ("topic"); and
    `takes_value(option)` says which of the tool's own options take a value."""
    readings = _readings(argv, takes_value)
    host = next((value for name, value in readings if name in _HOST and value), None)
    port = next((value for name, value in readings
                 if name in _PORT and value and value.isdigit()), None)
    address = _address(host, port, path)
    topics = [value for name, value in readings if name in ("-t", "--topic", "--type")]
    for name, value in readings:
        if name == "--host" or (name == "-h" and value is not None):
            meaning = "-h is --help here; " if name == "-h" else "--host: "
            return f"{meaning}the broker goes in the ADDRESS: {address}"
        if name == "--port" or (name == "-p" and value is not None and value.isdigit()):
            meaning = (f"-p is --protocol here ({', '.join(protocols)}); " if name == "-p"
                       else "--port: ")
            return f"{meaning}the port goes in the ADDRESS: {address}"
        if name in ("-L", "--url"):
            return f"{name}: " + _from_url(value, path)
        if name in _CLIENT_ID:
            if tool in ("produce", "events"):
                return f"{name}: the client ID is --client-id ID here"
            return f"{name}: {tool} connects without a client ID"
        if name in ("-q", "--qos") and tool in _RECEIVERS:
            return (f"{name}: {tool} has no QoS levels: it prints every message the broker "
                    "sends it while it is connected, in order")
        for names, line in _ONLY_MOSQUITTO.items():
            if name in names:
                return f"{name}: " + line.format(tool=tool, address=address)
    if one_topic is not None and len(topics) > 1:
        return (f"{tool} takes one {one_topic}, and -t came {len(topics)} times "
                f"({', '.join(map(repr, topics))}): run {tool} once per {one_topic}")
    return None


def check_habits(parser: argparse.ArgumentParser, tool: str, *, path: str,
                 one_topic: str | None = None) -> None:
    """Make `parser` (a tool's subcommand parser) exit 2 with one line when its arguments hold
    a mosquitto habit, before it reads them. (argparse would print the help for ``-h HOST`` and
    exit 0, and keep the last of two ``-t``.)"""
    actions = {option: action for action in parser._actions for option in action.option_strings}
    protocols = next((list(action.choices) for option, action in actions.items()
                      if option == "--protocol" and action.choices), [])

    def takes_value(name: str) -> bool:
        action = actions.get(name)
        if action is None and name.startswith("--"):
            matches = [option for option in actions if option.startswith(name)]
            action = actions[matches[0]] if len(matches) == 1 else None
        return action is not None and action.nargs != 0

    parse = parser.parse_known_args

    def checked(args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
                ) -> tuple[argparse.Namespace, list[str]]:
        words = list(args or ())
        if _help_cluster(words):
            parser.print_help()
            parser.exit(0)
        line = foreign_habit(tool, words, path=path, protocols=protocols,
                             one_topic=one_topic, takes_value=takes_value)
        if line is not None:
            parser.exit(2, f"{parser.prog}: {line}\n")
        return parse(args, namespace)

    # The subcommand's own parser reads its arguments through parse_known_args (argparse's
    # subparsers action calls it), so the check runs before any of them is taken.
    vars(parser)["parse_known_args"] = checked  # an instance attribute: this parser alone
