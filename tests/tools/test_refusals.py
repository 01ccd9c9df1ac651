"""Errors a user can act on, as real processes against a real `wireproto serve`: a refused
handshake says which credentials the broker takes and which option gives them (never a secret),
or what else is refused; a wrong path or protocol says what the broker serves there and where the
tool should have gone. Each line is asserted whole, with its exit code (docs/tools.md)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_twisted

from tests.access.conftest import AuthFiles
from tests.tools.served import Processes, one_line

ON_ONE_PORT = ("websmq+ws@tcp:0", "ubre+ws@tcp:0", "subble+ws@tcp:0", "nydus+engineio@tcp:0")
TAKES = ("a token (--token JWT, or $WIREPROTO_TOKEN) or a user and password (--user USER, the "
         "password in $WIREPROTO_PASSWORD)")


def listen(*specs: str) -> list[str]:
    return [word for spec in specs for word in ("--listen", spec)]


async def auth_broker(processes: Processes, auth_files: AuthFiles, tmp_path: Path,
                      **auth: object) -> dict[str, str]:
    """A broker with [auth] (tokens and passwords): websmq, ubre, subble and nydus on one port,
    and UBRE on another whose listener admits bob alone."""
    config = tmp_path / "auth.toml"
    config.write_text(
        "".join(f'[[listen]]\nprotocol = "{protocol}"\ntransport = "{transport}"\n'
                'endpoint = "tcp:0"\n' for protocol, transport in (
                    ("websmq", "ws"), ("ubre", "ws"), ("subble", "ws"), ("nydus", "engineio")))
        + '[[listen]]\nprotocol = "ubre"\ntransport = "ws"\nendpoint = "tcp:0:interface=127.0.0.2"'
        '\nallow = ["bob"]\n'
        + auth_files.auth_table(**auth)
        + '[[acl]]\nprincipal = "carol"\npublish = ["#"]\nsubscribe = ["#"]\ncall = ["#"]\n'
    )
    return await processes.serve("--config", str(config))


@pytest_twisted.ensureDeferred
async def test_a_refused_handshake_says_which_credentials_the_broker_takes(
    processes: Processes, auth_files: AuthFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = await auth_broker(processes, auth_files, tmp_path)
    websmq, ubre = served["websmq over ws"], served["ubre over ws"]
    subble, nydus = served["subble over ws"], served["nydus over engineio"]
    forged = auth_files.token(key=b"k" * 32)
    expired = auth_files.token(lifetime=-60)

    cases = [
        (("pub", websmq, "-t", "x", "-m", "hi"), f"wireproto pub: {websmq}: 401 Unauthorized: "
         f"the broker wants {TAKES}"),
        (("sub", ubre, "-t", "x", "--token", forged), f"wireproto sub: {ubre}: 401 "
         "Unauthorized: the broker refused the token (expired, or not signed with a key it "
         "takes)"),
        (("events", subble, "-t", "door", "--token", expired), f"wireproto events: {subble}: "
         "401 Unauthorized: the broker refused the token (expired, or not signed with a key it "
         "takes)"),
        # Engine.IO's own 403 for refused credentials, with the schemes the broker takes.
        (("call", nydus, "/_hub/publish", "{}"), f"wireproto call: {nydus}: 403 Forbidden: the "
         f"broker wants {TAKES}"),
    ]
    for args, line in cases:
        assert await one_line(processes.run(*args), 4) == line, args

    monkeypatch.setenv("WIREPROTO_PASSWORD", "not carol's password")
    refused = processes.run("call", ubre, "echo", "1", "-u", "carol")
    assert await one_line(refused, 4) == (
        f"wireproto call: {ubre}: 401 Unauthorized: the broker refused the user or the password "
        "(or, after many failed logins, waits before it checks them again)")
    # -u is --user, as mosquitto's: with the right password, in.
    monkeypatch.setenv("WIREPROTO_PASSWORD", "carol's password")
    published = processes.run("pub", websmq, "-t", "x", "-m", "hi", "-u", "carol")
    assert await published.exit_code() == 0, published.output()

    # A listener that admits bob alone: carol is known, and refused there.
    only_bob = next(address for _, address in processes.listening if "127.0.0.2" in address)
    assert await one_line(processes.run("call", only_bob, "echo", "1", "-u", "carol"), 4) == (
        f"wireproto call: {only_bob}: 403 Forbidden: the broker does not let this principal in "
        "here (the listener's allow list)")
    for tool in processes.started:
        assert not any(secret in line for line in tool.stderr
                       for secret in (forged, expired, "carol's password", "not carol's"))


@pytest_twisted.ensureDeferred
async def test_a_broker_with_only_passwords_says_it_takes_no_tokens(
    processes: Processes, auth_files: AuthFiles, tmp_path: Path,
) -> None:
    served = await auth_broker(processes, auth_files, tmp_path, jwt_algorithms=[],
                               jwt_secret_file="")
    websmq = served["websmq over ws"]
    tool = processes.run("pub", websmq, "-t", "x", "-m", "hi", "--token", auth_files.token())
    assert await one_line(tool, 4) == (
        f"wireproto pub: {websmq}: 401 Unauthorized: the broker takes no tokens: give a user "
        "and password (--user USER, the password in $WIREPROTO_PASSWORD)")


@pytest_twisted.ensureDeferred
async def test_a_wrong_path_or_protocol_says_what_the_broker_serves_there(
    processes: Processes,
) -> None:
    served = await processes.serve(*listen(*ON_ONE_PORT, "websmq+length32@tcp:0",
                                           "ubre+lines@tcp:0"))
    websmq, ubre = served["websmq over ws"], served["ubre over ws"]
    subble, nydus = served["subble over ws"], served["nydus over engineio"]
    port = urlsplit(websmq).netloc
    stream = served["websmq over length32"]
    cases = [
        (("pub", f"ws://{port}/nope", "-p", "websmq", "-t", "x", "-m", "hi"), 4,
         f"wireproto pub: ws://{port}/nope: 404 Not Found: nothing is served at /nope; for "
         f"websmq use {websmq}"),
        (("events", f"ws://{port}/mq", "-p", "subble", "-t", "door"), 4,
         f"wireproto events: ws://{port}/mq: 404 Not Found: nothing is served at /mq; for "
         f"subble use {subble}"),
        # A UBRE client on the WEBSMQ path: the broker's close names what it serves there.
        (("pub", websmq, "-p", "ubre", "-t", "x", "-m", "hi"), 1,
         f"wireproto pub: {websmq} serves websmq, not ubre; for ubre use {ubre} (the broker "
         "said: WEBSMQ frames are binary: a text frame is not WEBSMQ)"),
        (("sub", ubre, "-p", "websmq", "-t", "x"), 3,
         f"wireproto sub: {ubre} serves ubre, not websmq; for websmq use {websmq} (the broker "
         "said: UBRE message starts with byte 0x40: neither '{' (JSON) nor a binary type (S P "
         "R s f U))"),
        (("call", websmq, "-p", "ubre", "echo", "1"), 3,
         f"wireproto call: {websmq} serves websmq, not ubre; for ubre use {ubre} (the broker "
         "said: WEBSMQ frames are binary: a text frame is not WEBSMQ)"),
        (("produce", ubre, "-p", "subble", "-t", "door", "-m", "open"), 3,
         f"wireproto produce: {ubre} serves ubre, not subble; for subble use {subble} (the "
         "broker said: UBRE message starts with byte 0x01: neither '{' (JSON) nor a binary "
         "type (S P R s f U))"),
        (("events", websmq, "-p", "subble", "-t", "door"), 3,
         f"wireproto events: {websmq} serves websmq, not subble; for subble use {subble} (the "
         "broker said: WEBSMQ Publish frame: the header announces a topic of 257 bytes but "
         "only 20 follow the header)"),
        # Engine.IO and WebSocket paths: refused at the handshake, naming the right one.
        (("call", f"http://{port}/ubre", "-p", "nydus", "/_hub/publish", "{}"), 4,
         f"wireproto call: http://{port}/ubre serves ubre, not nydus: for nydus use {nydus}"),
        (("pub", f"ws://{port}/engine.io/", "-p", "websmq", "-t", "x", "-m", "hi"), 4,
         f"wireproto pub: ws://{port}/engine.io/ serves nydus, not websmq: for websmq use "
         f"{websmq}"),
        # A stream port of another protocol closes without an answer.
        (("call", stream, "-p", "ubre", "echo", "1"), 3,
         f"wireproto call: {stream} closed the connection without an answer: does it serve "
         "ubre? wireproto serve's banner names each port's protocol"),
        (("events", stream, "-t", "door"), 3,
         f"wireproto events: {stream} closed the connection without an answer: does it serve "
         "subble? wireproto serve's banner names each port's protocol"),
    ]
    for args, code, line in cases:
        assert await one_line(processes.run(*args), code) == line, args


@pytest_twisted.ensureDeferred
async def test_an_origin_the_broker_does_not_take_is_named(
    processes: Processes, tmp_path: Path,
) -> None:
    config = tmp_path / "origins.toml"
    config.write_text('[[listen]]\nprotocol = "websmq"\ntransport = "ws"\nendpoint = "tcp:0"\n'
                      '[websocket]\nallowed_origins = ["https://app.example:443"]\n')
    websmq = (await processes.serve("--config", str(config)))["websmq over ws"]
    tool = processes.run("pub", websmq, "-t", "x", "-m", "hi", "-H", "Origin: https://evil.example")
    assert await one_line(tool, 4) == (
        f"wireproto pub: {websmq}: 403 Forbidden: the broker does not take this Origin header "
        "(its [websocket] allowed_origins)")
