"""No secret the user gave reaches what the tools, `serve` and `check-config` print, and none can
smuggle a header into a handshake: real processes against a real `wireproto serve` (with [auth])
and a real socket that records what a tool sends."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.protocol import Factory

from tests.access.conftest import AuthFiles, _Collector
from tests.support import free_port
from tests.tools.served import Processes, one_line
from tests.tools.test_refusals import auth_broker
from wireproto.transports.websocket import websocket_client_factory

SECRETS = ("S3cr3tPassw0rd", "TOKSECRET123", "URLPW444", "SECRETX1", "SECRETX2", "QSECRET5")
USER_INFORMATION = (
    "ADDRESS holds user information (user:password@), which is not sent: give --user USER with "
    "the password in $WIREPROTO_PASSWORD, or a token in $WIREPROTO_TOKEN (or --token)")


def _secret_free(line: str) -> str:
    assert not [secret for secret in SECRETS if secret in line], line
    return line


@pytest_twisted.ensureDeferred
async def test_no_credential_of_an_address_is_printed_and_user_information_is_refused(
    processes: Processes, auth_files: AuthFiles, tmp_path: Path,
) -> None:
    served = await auth_broker(processes, auth_files, tmp_path)
    websmq, nydus = served["websmq over ws"], served["nydus over engineio"]
    port = websmq.split(":")[2].split("/")[0]
    with_password = websmq.replace("ws://", "ws://alice:S3cr3tPassw0rd@")

    # A password in ADDRESS would show in the process list, and was silently dropped: refused.
    for args in (("pub", with_password, "-t", "x", "-m", "hi"),
                 ("sub", websmq.replace("ws://", "ws://carol@"), "-t", "x"),
                 ("call", nydus.replace("http://", "http://bob:URLPW444@"), "/x", "{}"),
                 ("events", with_password.replace("/websmq", "/subble"), "-t", "door")):
        line = _secret_free(await one_line(processes.run(*args), 2))
        assert line == f"wireproto {args[0]}: {USER_INFORMATION}", args

    # A token in the query is sent (browsers must), and never repeated in an error.
    line = await one_line(processes.run(
        "pub", f"{websmq}?access_token=TOKSECRET123&password=QSECRET5", "-t", "x", "-m", "hi"), 4)
    assert _secret_free(line).startswith(
        f"wireproto pub: {websmq}?access_token=***&password=***: 401 Unauthorized"), line
    nowhere = f"ws://127.0.0.1:{free_port()}/websmq?token=SECRETX1"
    line = await one_line(processes.run("pub", nowhere, "-t", "x", "-m", "hi"), 3)
    assert _secret_free(line).startswith(
        f"wireproto pub: cannot reach {nowhere.replace('SECRETX1', '***')}"), line
    # A path that names no protocol is asked of the broker: its answer names the address,
    # and a secret of its query is not repeated.
    unknown = f"ws://127.0.0.1:{port}/nopath?token=SECRETX2"
    line = await one_line(processes.run("pub", unknown, "-t", "x", "-m", "hi"), 4)
    assert _secret_free(line).startswith(
        f"wireproto pub: ws://127.0.0.1:{port}/nopath?token=***: 404 Not Found"), line


@pytest_twisted.ensureDeferred
async def test_an_address_with_a_space_or_a_fragment_is_refused_and_never_repeated(
    processes: Processes, auth_files: AuthFiles, tmp_path: Path,
) -> None:
    served = await auth_broker(processes, auth_files, tmp_path)
    websmq, nydus = served["websmq over ws"], served["nydus over engineio"]
    port = websmq.split(":")[2].split("/")[0]
    space = "ADDRESS holds a space: percent-encode it (%20)"
    # A space was sent as it is (400 Bad Request), and ended the redaction of the line early.
    for args, said in (
        (("pub", f"{websmq}?password=correct horse SPACESECRET", "-t", "x", "-m", "a"), space),
        (("pub", f"ws://127.0.0.1:{port}/my topics?access_token=SPACESECRET", "-t", "x", "-m",
          "a", "-p", "websmq"), space),
        (("pub", f"ws://127.0.0.1:{free_port()}/my topics?access_token=SPACESECRET", "-t", "x",
          "-m", "a", "-p", "websmq"), space),
        (("call", f"{nydus}?token=a\tSPACESECRET", "/x", "{}"),
         "ADDRESS holds a control character or whitespace (a tab, a line break...)"),
        # A fragment is never sent; OAuth's implicit flow puts a token there.
        (("sub", f"{websmq}#access_token=FRAGSECRET", "-t", "x"),
         "ADDRESS holds a fragment (#...), which is never sent: leave it out"),
    ):
        line = await one_line(processes.run(*args), 2)
        assert line.startswith(f"wireproto {args[0]}: {said}"), (args, line)
        assert "SECRET" not in line and "horse" not in line, line
    # An address whose end a line's redaction cannot find (a quote in it) is redacted whole.
    quoted = f'ws://127.0.0.1:{port}/a"b?access_token=QUOTESECRET'
    line = await one_line(processes.run("pub", quoted, "-t", "x", "-m", "a", "-p", "websmq"), 4)
    assert line.startswith(f'wireproto pub: ws://127.0.0.1:{port}/a"b?access_token=***: 404'), line


def test_check_config_and_serve_print_no_credential_of_a_link(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "p.toml"
    config.write_text('[[phyllo]]\nname = "d"\nendpoint = '
                      '"ws://u:CFGSECRET@127.0.0.1:1/x?access_token=CTOK&pwd=CPWD"\n')
    checked = subprocess.run([sys.executable, "-m", "wireproto", "check-config", str(config)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "phyllo: phyllo link d (reduced stack, hub topics phyllo/d/...) on " \
        "ws://***@127.0.0.1:1/x?access_token=***&pwd=***" in checked.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[[phyllo]]\nname = "d"\nendpoint = "ws://u:CFGSECRET@h:99999/x?sig=CSIG"\n')
    for args in (("serve", "--phyllo", "bad name@ws://u:ARGSECRET@h/x"),
                 ("serve", "--config", str(bad)), ("check-config", str(bad))):
        ended = subprocess.run([sys.executable, "-m", "wireproto", *args], capture_output=True,
                               text=True, timeout=60)
        assert ended.returncode == 2, (args, ended.stderr)
        printed = ended.stdout + ended.stderr
        assert ended.stderr.strip() and not any(
            secret in printed for secret in ("CFGSECRET", "ARGSECRET", "CSIG")), printed
        assert "***@" in ended.stderr, ended.stderr


@pytest_twisted.ensureDeferred
async def test_a_header_a_line_break_or_a_handshake_header_is_refused_never_sent(
    processes: Processes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A socket that records whatever a tool sends it.
    heard: list[_Collector] = []

    def record() -> _Collector:
        heard.append(_Collector())
        return heard[-1]

    port = reactor.listenTCP(0, Factory.forProtocol(record), interface="127.0.0.1")
    try:
        url = f"ws://127.0.0.1:{port.getHost().port}/websmq"
        cases = [
            (("--token", "abc\r\nX-Injected: 1"), "--token holds a control character"),
            (("-H", "X-A: b\r\nX-Injected: 2"),
             "-H: the value of header X-A holds a control character"),
            (("-H", "X-A\nX-Injected: 3"), "-H: a header's name is letters"),
            (("-u", "alice\r\nX-Injected: 4"), "--user holds a control character"),
            (("-H", "Host: evil.example"), "-H: the handshake sets Host itself"),
            (("-H", "sec-websocket-key: x"), "-H: the handshake sets sec-websocket-key itself"),
            # A byte that is not UTF-8 (argv holds it as a surrogate escape) broke the handshake
            # with a traceback and a 10 s wait.
            (("--token", "TOK\udcff"), "--token is not UTF-8 text"),
            (("-H", "Cookie: s=\udce9"), "-H: the value of header Cookie is not UTF-8 text"),
        ]
        monkeypatch.setenv("WIREPROTO_PASSWORD", "pw")
        for options, said in cases:
            line = await one_line(processes.run("pub", url, "-t", "x", "-m", "hi", *options), 2)
            assert line.startswith(f"wireproto pub: {said}"), (options, line)
            assert "Injected" not in line and "evil" not in line, line
        monkeypatch.setenv("WIREPROTO_PASSWORD", "p\udcffw")
        line = await one_line(processes.run("pub", url, "-t", "x", "-m", "hi", "-u", "alice"), 2)
        assert line == "wireproto pub: $WIREPROTO_PASSWORD is not UTF-8 text " \
            "(a byte of another encoding?)", line
        monkeypatch.delenv("WIREPROTO_PASSWORD")
        monkeypatch.setenv("WIREPROTO_TOKEN", "TOK\udcfe")
        line = await one_line(processes.run("sub", url, "-t", "x"), 2)
        assert line.startswith("wireproto sub: $WIREPROTO_TOKEN is not UTF-8 text"), line
        monkeypatch.setenv("WIREPROTO_TOKEN", "abc\nX-Injected: 5")
        line = await one_line(processes.run("sub", url, "-t", "x"), 2)
        assert line.startswith("wireproto sub: $WIREPROTO_TOKEN holds a control character")
        assert "Injected" not in line
        assert not any(b"Injected" in each.received or b"evil" in each.received
                       for each in heard), [each.received for each in heard]
    finally:
        await port.stopListening()


@pytest.mark.parametrize("headers", [
    {"X-A": "b\r\nX-Injected: 1"}, {"X-A\r\nX-Injected": "1"}, {"Host": "evil"},
    {"Sec-WebSocket-Protocol": "x"}, {"X-A": "\x1b[31m"}, {"X-A": "a\x85b"}, {"X-A": "\udc85"},
])
def test_a_library_user_gets_a_value_error_not_a_smuggled_header(headers: dict) -> None:
    with pytest.raises(ValueError) as refused:
        websocket_client_factory("ws://127.0.0.1:1/websmq", lambda: None, headers=headers)
    assert "Injected" not in str(refused.value) and "evil" not in str(refused.value)


def test_a_user_agent_replaces_autobahns_own() -> None:
    factory = websocket_client_factory("ws://127.0.0.1:1/websmq", lambda: None,
                                       headers={"User-Agent": "probe/1", "X-A": "b"})
    assert factory.useragent == "probe/1" and factory.headers == {"X-A": "b"}
