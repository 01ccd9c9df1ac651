"""mosquitto_pub's and mosquitto_sub's habits, as real processes against a real broker: each
option that wireproto would misread, or that only mosquitto has, is one line on stderr saying the
wireproto way and exit 2, and nothing is published; `-u` and sub's `-v` mean what they mean
there (docs/tools.md, "Coming from mosquitto")."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import pytest_twisted

from tests.support import eventually
from tests.tools.served import Processes, one_line

LISTEN = ("--listen", "websmq+ws@tcp:0", "--listen", "ubre+ws@tcp:0",
          "--listen", "subble+ws@tcp:0")


@pytest_twisted.ensureDeferred
async def test_mosquitto_options_on_pub_and_sub_say_the_wireproto_way_and_publish_nothing(
    processes: Processes,
) -> None:
    addresses = await processes.serve(*LISTEN)
    websmq, ubre = addresses["websmq over ws"], addresses["ubre over ws"]
    port = str(urlsplit(websmq).port)
    # A subscriber to every topic the commands below name, on both protocols (-v: mosquitto's
    # "topic and payload", which is what sub prints anyway).
    watchers = [processes.run("sub", address, "-t", "x", "-t", "a", "-t", "b", "-t", "sync",
                              "-v") for address in (websmq, ubre)]

    async def synced(tag: str) -> None:
        # WEBSMQ and UBRE subscribes have no answer: publish until both watchers print it.
        def seen() -> bool:
            if not all(f"sync {tag}" in watcher.stdout for watcher in watchers):
                processes.run("pub", websmq, "-t", "sync", "-m", tag)
                return False
            return True

        await eventually(seen, timeout=30, interval=1.0)

    await synced("before")
    cases = {
        ("pub", "-h", "127.0.0.1", "-p", port, "-t", "x", "-m", "hi"):
            f"wireproto pub: -h is --help here; the broker goes in the ADDRESS: {websmq}",
        ("pub", websmq, "-p", port, "-t", "x", "-m", "hi"):
            "wireproto pub: -p is --protocol here (websmq, ubre, phyllo); the port goes in the "
            f"ADDRESS: ws://127.0.0.1:{port}/websmq",
        ("pub", websmq, "-t", "a", "-t", "b", "-m", "hi"):
            "wireproto pub: pub takes one topic, and -t came 2 times ('a', 'b'): run pub once "
            "per topic",
        ("pub", ubre, "--topic=a", "-t", "b", "-m", "hi"):
            "wireproto pub: pub takes one topic, and -t came 2 times ('a', 'b'): run pub once "
            "per topic",
        ("pub", websmq, "-t", "x", "-m", "hi", "-r"):
            "wireproto pub: -r: pub has no retain flag: the broker keeps the last message of "
            "the topics its [hub] retain patterns match, for later subscribers",
        ("pub", websmq, "-t", "x", "-m", "hi", "-q", "1"):
            "wireproto pub: -q: pub has no QoS levels: it exits 0 only once every message is "
            "written and the connection closed cleanly",
        ("pub", websmq, "-t", "x", "-m", "hi", "-u", "carol", "-P", "hunter2"):
            "wireproto pub: -P: a password on the command line shows in the process list: "
            "give --user USER (or -u) and the password in $WIREPROTO_PASSWORD",
        ("pub", "-L", f"mqtt://carol:hunter2@127.0.0.1:{port}/x", "-m", "hi"):
            f"wireproto pub: -L: give the broker as the ADDRESS ({websmq}) and the topic "
            "with -t x",
        ("pub", websmq, "-t", "x", "-m", "hi", "-i", "me"):
            "wireproto pub: -i: pub connects without a client ID",
        ("pub", websmq, "-t", "x", "-m", "hi", "-k", "60"):
            "wireproto pub: -k: pub has no keepalive option: the broker pings WebSocket "
            "clients ([websocket] auto_ping_interval)",
        ("pub", websmq, "-t", "x", "-m", "hi", "-d"):
            "wireproto pub: -d: pub has no debug output: errors are one line on stderr, and "
            "the broker logs connections with wireproto serve -v",
        ("pub", websmq, "-t", "x", "-m", "hi", "-V", "mqttv311"):
            "wireproto pub: -V: the protocol is the ADDRESS's path (/websmq, /ubre) or "
            "-p/--protocol PROTOCOL",
        ("sub", "-h", "localhost", "-t", "x", "-C", "1"):
            "wireproto sub: -h is --help here; the broker goes in the ADDRESS: "
            "ws://localhost:8765/websmq",
        ("sub", websmq, "-p", port, "-t", "x", "-C", "1"):
            "wireproto sub: -p is --protocol here (websmq, ubre, phyllo); the port goes in "
            f"the ADDRESS: ws://127.0.0.1:{port}/websmq",
        ("sub", websmq, "-t", "x", "-W", "5"):
            "wireproto sub: -W: the time limit is --timeout SECONDS (as mosquitto_sub -W)",
        ("sub", "--host", "127.0.0.1", "--port", port, "-t", "x"):
            f"wireproto sub: --host: the broker goes in the ADDRESS: {websmq}",
    }
    for args, line in cases.items():
        assert await one_line(processes.run(*args), 2) == line, args
        assert not any("hunter2" in text for text in processes.started[-1].stderr)
    await synced("after")
    for watcher in watchers:
        # Nothing reached the topics the refused commands named, only the syncs.
        assert {line.split()[0] for line in watcher.stdout} == {"sync"}, watcher.output()


@pytest.mark.parametrize("args, line", [
    (("call", "-h", "127.0.0.1", "-p", "8765", "echo", "1"),
     "wireproto call: -h is --help here; the broker goes in the ADDRESS: "
     "ws://127.0.0.1:8765/ubre"),
    (("produce", "ws://127.0.0.1:1/subble", "-t", "door", "-t", "window", "-m", "open"),
     "wireproto produce: produce takes one event type, and -t came 2 times ('door', "
     "'window'): run produce once per event type"),
    (("events", "ws://127.0.0.1:1/subble", "-t", "door", "-i", "me"),
     "wireproto events: -i: the client ID is --client-id ID here"),
    (("events", "-h", "127.0.0.1", "-t", "door"),
     "wireproto events: -h is --help here; the broker goes in the ADDRESS: "
     "ws://127.0.0.1:8765/subble"),
    # A receiver's -q is not about writing (it had pub's explanation).
    (("sub", "ws://127.0.0.1:1/websmq", "-t", "x", "-q", "1"),
     "wireproto sub: -q: sub has no QoS levels: it prints every message the broker sends it "
     "while it is connected, in order"),
    (("events", "ws://127.0.0.1:1/subble", "-t", "door", "-q", "1"),
     "wireproto events: -q: events has no QoS levels: it prints every message the broker "
     "sends it while it is connected, in order"),
])
@pytest_twisted.ensureDeferred
async def test_the_same_letters_on_call_produce_and_events(
    processes: Processes, args: tuple[str, ...], line: str
) -> None:
    assert await one_line(processes.run(*args), 2) == line


@pytest_twisted.ensureDeferred
async def test_h_alone_is_still_help(processes: Processes) -> None:
    for tool in ("pub", "sub", "call", "produce", "events"):
        helped = processes.run(tool, "-h")
        assert await helped.exit_code() == 0, helped.output()
        assert helped.stdout[0].startswith(f"usage: wireproto {tool} "), helped.output()


@pytest_twisted.ensureDeferred
async def test_h_in_a_cluster_of_short_options_is_help(processes: Processes) -> None:
    # `pub ... -hv` was argparse's "ignored explicit argument 'v'" (pub has no -v), exit 2.
    for args in (("pub", "ws://127.0.0.1:1/websmq", "-t", "x", "-m", "hi", "-hv"),
                 ("pub", "-vh"), ("sub", "-hv"), ("call", "-hv"), ("events", "-vh")):
        helped = processes.run(*args)
        assert await helped.exit_code() == 0, helped.output()
        assert helped.stdout[0].startswith(f"usage: wireproto {args[0]} "), helped.output()
