"""docs/wireproto.example.toml: it loads, names every key of every table, passes `wireproto
check-config`, serves (on free ports) with a message crossing from WEBSMQ to UBRE, and a copy with
a typo fails naming the file and the key. The TOML examples in docs/configuration.md and
docs/security.md load too."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from tests.support import wait_for
from tests.test_cli import Child
from wireproto.config import (
    DEFAULT_LISTENERS,
    Attach,
    Config,
    ConfigError,
    Listener,
    PhylloLink,
    config_from_toml,
    load_config,
)
from wireproto.protocols import websmq
from wireproto.protocols.ubre.client import UbreClient
from wireproto.settings import table_readers

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "wireproto.example.toml"
SETTINGS_TABLES = list(Config().tables)
TLS_MARKER = "# TLS: uncomment"


def example_text() -> str:
    return EXAMPLE.read_text(encoding="utf-8")


def with_tls_uncommented(text: str) -> str:
    """The example with its commented-out TLS [[listen]] block switched on."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(TLS_MARKER))
    index = start + 1
    while lines[index].startswith("#"):
        if lines[index].startswith("# [[listen]]"):
            break
        index += 1
    while index < len(lines) and lines[index].startswith("# "):
        lines[index] = lines[index][2:]
        index += 1
    return "\n".join(lines) + "\n"


def check_config(path: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wireproto", "check-config", str(path)],
        capture_output=True, text=True, timeout=60, cwd=cwd, stdin=subprocess.DEVNULL,
    )


def test_the_example_loads_with_what_it_says() -> None:
    config = load_config(EXAMPLE, reactor=reactor)
    unix = Listener("ubre", "length32", "unix:/tmp/wireproto-ubre.sock:mode=660")
    assert config.listeners == (*DEFAULT_LISTENERS, unix)
    assert config.attach == (
        Attach("websmq", "serial:/dev/ttyACM0:baudrate=115200", "cobs"),
    )
    assert config.phyllo == (
        PhylloLink("dev1", "serial:/dev/ttyUSB0:baudrate=115200", "reduced", "phyllo/dev1",
                   "msgpack", 255),
    )
    assert config.subble.deny == ("192.0.2.0/24",)
    defaults = Config()
    for name in SETTINGS_TABLES:
        if name != "subble":
            # Written out as the defaults are, so a reader sees them.
            assert getattr(config, name) == getattr(defaults, name), name


def test_the_example_has_every_table_and_key() -> None:
    text = example_text()
    for table in ("listen", "attach", "phyllo"):
        assert f"\n[[{table}]]\n" in text, table
    for name in SETTINGS_TABLES:
        # [auth] turns authentication on, so the example shows it commented out.
        header = "# [auth]" if name == "auth" else f"[{name}]"
        assert re.search(rf"^{re.escape(header)}", text, re.MULTILINE), f"no [{name}] table"
        section = re.split(r"^(# )?\[", text.split(f"\n{header}", 1)[1], maxsplit=1,
                           flags=re.MULTILINE)[0]
        for key in table_readers(type(getattr(Config(), name))):
            # A key that is off by default (TOML has no null) may be shown commented out.
            assert re.search(rf"^(# )?{key} = ", section, re.MULTILINE), (
                f"[{name}] {key} is not in the example"
            )


def test_check_config_accepts_the_example() -> None:
    done = check_config(Path("docs/wireproto.example.toml"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == "wireproto: docs/wireproto.example.toml: ok"
    assert "wireproto: listen: websmq over ws on tcp:8765:interface=127.0.0.1 at /websmq" in lines
    assert "wireproto: attach: websmq over cobs on serial:/dev/ttyACM0:baudrate=115200" in lines
    assert len([line for line in lines if line.startswith("wireproto: listen: ")]) == 9


@pytest.mark.parametrize(
    ("good", "bad", "problem"),
    [
        ("max_subscriptions = 1000", "max_subscriptons = 1000",
         "hub.max_subscriptons: unknown key; use queue_bytes, overflow, max_subscriptions, "
         "max_topic_length, max_subscription_bytes, max_total_subscription_bytes, retain, "
         "max_retained, max_retained_bytes, retained_examined_per_second, retain_file, "
         "max_document_elements or max_document_depth "
         "(did you mean 'max_subscriptions'?)"),
        ('endpoint = "tcp:8769"', 'endpoint = "tpc:8769"',
         "listen[8].endpoint: bad server endpoint 'tpc:8769': Unknown endpoint type: 'tpc'"),
        ('framing = "cobs"', 'framing = "cobbs"',
         "attach[1].framing: unknown framing 'cobbs'; use length32, lines or cobs"),
        ('overflow = "drop-oldest"', 'overflow = "drop-newest"',
         'hub.overflow: unknown policy "drop-newest"; use drop-oldest or disconnect'),
    ],
)
def test_a_copy_with_a_typo_names_the_file_and_the_key(
    tmp_path: Path, good: str, bad: str, problem: str
) -> None:
    text = example_text()
    assert text.count(good) == 1, good
    copy = tmp_path / "wireproto.toml"
    copy.write_text(text.replace(good, bad), encoding="utf-8")
    done = check_config(copy)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"wireproto check-config: {copy}: {problem}\n"


def test_the_tls_block_loads_where_its_files_are(
    tmp_path: Path, tls_files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "tls.toml"
    copy.write_text(with_tls_uncommented(example_text()), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(copy))}: listen\[10\]\.endpoint: "
                                          r"bad server endpoint 'ssl:8443:privateKey=key.pem"):
        load_config(copy, reactor=reactor)

    shutil.copy(tls_files.key, tmp_path / "key.pem")
    shutil.copy(tls_files.cert, tmp_path / "cert.pem")
    config = load_config(copy, reactor=reactor)
    assert config.listeners[-1] == Listener(
        "websmq", "ws", "ssl:8443:privateKey=key.pem:certKey=cert.pem:interface=127.0.0.1",
        "/websmq",
    )
    done = check_config(copy, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def toml_fences(page: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(r"^```toml\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", ["configuration.md", "security.md"])
def test_the_toml_examples_in_the_docs_load(
    page: str, tmp_path: Path, tls_files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Their TLS listeners name key.pem, cert.pem (and ca.pem) in the directory the broker runs in.
    shutil.copy(tls_files.key, tmp_path / "key.pem")
    shutil.copy(tls_files.cert, tmp_path / "cert.pem")
    shutil.copy(tls_files.cert, tmp_path / "chain.pem")
    shutil.copy(tls_files.cert, tmp_path / "ca.pem")  # the CA of mtls: client certificates
    monkeypatch.chdir(tmp_path)
    examples = toml_fences(page)
    assert examples, f"docs/{page} has ```toml examples"
    for number, example in enumerate(examples, 1):
        config_from_toml(example, source=f"docs/{page} example {number}", reactor=reactor)


LISTENER_LINE = re.compile(r"^wireproto: (\S+) over (\S+) on (\S+)$")
READY = re.compile(r"^wireproto: ready; Ctrl-C stops$")


def on_free_ports(text: str, directory: Path) -> str:
    """The example with every TCP port 0, its unix socket and devices under `directory`."""
    text = re.sub(r'"tcp:\d+"', '"tcp:0"', text)
    text = text.replace("/tmp/wireproto-ubre.sock", str(directory / "ubre.sock"))
    return re.sub(r"serial:/dev/tty\w+", f"serial:{directory}/no-such-device", text)


@pytest_twisted.ensureDeferred
async def test_the_example_serves(tmp_path: Path) -> None:
    copy = tmp_path / "wireproto.toml"
    copy.write_text(on_free_ports(example_text(), tmp_path), encoding="utf-8")
    child = Child(sys.executable, "-m", "wireproto", "serve", "--config", str(copy))
    try:
        await child.line(READY)
        bound = [match.groups() for match in map(LISTENER_LINE.match, child.stdout) if match]
        assert [(protocol, transport) for protocol, transport, _ in bound] == [
            (listener.protocol, listener.transport)
            for listener in (*DEFAULT_LISTENERS, Listener("ubre", "length32", "unix:x"))
        ]
        addresses = {(protocol, transport): address for protocol, transport, address in bound}
        assert addresses[("ubre", "length32")] == f"unix:{tmp_path}/ubre.sock"

        subscriber = await wait_for(
            UbreClient(reactor, addresses[("ubre", "lines")], request_timeout=5).connect()
        )
        publisher = await wait_for(websmq.connect(reactor, addresses[("websmq", "ws")]))
        try:
            got: defer.Deferred = defer.Deferred()
            subscriber.subscribe("example/topic", got.callback)
            # A reply (NotFound) shows the broker has read the subscribe before it.
            await wait_for(subscriber.request("nothing").addErrback(lambda _: None))
            await publisher.publish("example/topic", b'{"from":"websmq"}')
            message = await wait_for(got)
            assert message.body == {"from": "websmq"}
        finally:
            await wait_for(publisher.disconnect())
            await wait_for(subscriber.close())

        child.process.send_signal(signal.SIGINT)
        assert await child.exit_code() == 0, child.output()
    finally:
        child.kill()
