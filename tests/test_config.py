"""Config parsing: every --listen and --attach form, every error message, TOML files (round trip,
unknown keys, types), defaults, and the command line over a file."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import reactor

from wireproto.config import (
    DEFAULT_LISTENERS,
    TRANSPORTS,
    Attach,
    Config,
    ConfigError,
    HubSettings,
    Listener,
    StreamOptions,
    WebsmqSettings,
    build_config,
    config_from_toml,
    config_to_toml,
    is_ephemeral,
    load_config,
    parse_attach,
    parse_listen,
)
from wireproto.protocols import (
    ProtocolDescriptor,
    register_protocol,
    server_protocols,
    unregister_protocol,
)
from wireproto.transports import WebSocketOptions

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_defaults_listen_on_loopback_only() -> None:
    assert Config().listeners == DEFAULT_LISTENERS == (
        Listener("websmq", "ws", "tcp:8765:interface=127.0.0.1", "/websmq"),
        Listener("websmq", "length32", "tcp:8766:interface=127.0.0.1"),
        Listener("ubre", "ws", "tcp:8765:interface=127.0.0.1", "/ubre"),
        Listener("ubre", "lines", "tcp:8767:interface=127.0.0.1"),
        Listener("nydus", "engineio", "tcp:8765:interface=127.0.0.1", "/engine.io/"),
        Listener("nydus", "lines", "tcp:8768:interface=127.0.0.1"),
        Listener("subble", "ws", "tcp:8765:interface=127.0.0.1", "/subble"),
        Listener("subble", "length32", "tcp:8769:interface=127.0.0.1"),
    )
    assert build_config() == Config()
    config = Config()
    assert config.attach == ()
    assert config.hub == HubSettings(queue_bytes=1 << 20, overflow="drop-oldest",
                                     max_subscriptions=1000)
    assert config.websocket == WebSocketOptions()
    assert config.stream == StreamOptions(max_message_size=1 << 20, max_connections=10_000)
    assert config.protocol_options("websmq") == {"wildcards": False}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("websmq+ws@tcp:8765:interface=127.0.0.1",
         Listener("websmq", "ws", "tcp:8765:interface=127.0.0.1", "/websmq")),
        ("websmq+ws/mq/v1@tcp:8765",
         Listener("websmq", "ws", "tcp:8765:interface=127.0.0.1", "/mq/v1")),
        ("websmq+ws/@tcp:8765", Listener("websmq", "ws", "tcp:8765:interface=127.0.0.1", "/")),
        ("websmq+length32@tcp:8766:interface=127.0.0.1",
         Listener("websmq", "length32", "tcp:8766:interface=127.0.0.1")),
        ("websmq+cobs@unix:/tmp/websmq.sock", Listener("websmq", "cobs", "unix:/tmp/websmq.sock")),
        # Every interface only when asked for, by keyword or by position.
        ("websmq+ws@tcp:8765:interface=0.0.0.0",
         Listener("websmq", "ws", "tcp:8765:interface=0.0.0.0", "/websmq")),
        ("websmq+length32@tcp:8766:0.0.0.0", Listener("websmq", "length32", "tcp:8766:0.0.0.0")),
        ("websmq+length32@tcp:port=0",
         Listener("websmq", "length32", "tcp:port=0:interface=127.0.0.1")),
        ("websmq+ws@tcp6:8765", Listener("websmq", "ws", r"tcp6:8765:interface=\:\:1", "/websmq")),
    ],
)
def test_listen_forms(spec: str, expected: Listener) -> None:
    assert parse_listen(spec, reactor=reactor) == expected


def test_listen_over_tls_through_the_endpoint_string(tls_files: Any) -> None:
    key, cert = tls_files.key, tls_files.cert
    listener = parse_listen(f"websmq+ws@ssl:8443:privateKey={key}:certKey={cert}")
    assert listener == Listener(
        "websmq", "ws", f"ssl:8443:privateKey={key}:certKey={cert}:interface=127.0.0.1", "/websmq"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("websmq+wss@tcp:1",
         "--listen 'websmq+wss@tcp:1': unknown transport 'wss'; use ws, engineio, length32, "
         "lines or cobs"),
        ("websmq+lines@tcp:1",
         "--listen 'websmq+lines@tcp:1': websmq does not run over lines; use ws, length32 or cobs"),
        ("mqtt+ws@tcp:1",
         "--listen 'mqtt+ws@tcp:1': unknown protocol 'mqtt'; use websmq, ubre, nydus or subble"),
        ("websmq@tcp:1",
         "--listen 'websmq@tcp:1': no transport; use PROTOCOL+TRANSPORT[/PATH]@ENDPOINT, "
         "e.g. websmq+ws@tcp:8765 (transports: ws, engineio, length32, lines or cobs)"),
        ("websmq+ws",
         "--listen 'websmq+ws': no '@' before the endpoint; use PROTOCOL+TRANSPORT[/PATH]@ENDPOINT"
         ", e.g. websmq+ws@tcp:8765"),
        ("+ws@tcp:1",
         "--listen '+ws@tcp:1': no protocol before '+'/'@'; use PROTOCOL+TRANSPORT[/PATH]@ENDPOINT"
         ", e.g. websmq+ws@tcp:8765"),
        ("websmq+ws@", "--listen 'websmq+ws@': no endpoint given, e.g. tcp:8765"),
        ("websmq+length32/x@tcp:1",
         "--listen 'websmq+length32/x@tcp:1': a path is only for ws and engineio listeners, "
         "not length32"),
        ("websmq+ws@foo:1",
         "--listen 'websmq+ws@foo:1': bad server endpoint 'foo:1': Unknown endpoint type: 'foo'"),
        ("websmq+ws@tcp:1:bogus=2",
         "--listen 'websmq+ws@tcp:1:bogus=2': bad server endpoint "
         "'tcp:1:bogus=2:interface=127.0.0.1': got an unexpected keyword argument 'bogus'"),
        ("websmq+ws@tcp:http",
         "--listen 'websmq+ws@tcp:http': bad server endpoint 'tcp:http:interface=127.0.0.1': "
         "invalid literal for int() with base 10: 'http'"),
    ],
)
def test_listen_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_listen(spec, reactor=reactor)
    assert str(raised.value) == message


def test_listen_with_a_missing_certificate(tmp_path: Path) -> None:
    missing = tmp_path / "key.pem"
    with pytest.raises(ConfigError) as raised:
        parse_listen(f"websmq+ws@ssl:8443:privateKey={missing}")
    assert str(raised.value).startswith(
        f"--listen 'websmq+ws@ssl:8443:privateKey={missing}': bad server endpoint "
    )
    assert str(missing) in str(raised.value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("websmq@serial:/dev/ttyACM0:baudrate=115200",
         Attach("websmq", "serial:/dev/ttyACM0:baudrate=115200", "cobs")),
        ("websmq@serial:device=/dev/ttyUSB0",
         Attach("websmq", "serial:device=/dev/ttyUSB0", "cobs")),
        ("websmq+length32@serial:/dev/ttyACM0",
         Attach("websmq", "serial:/dev/ttyACM0", "length32")),
        ("websmq@tcp:192.0.2.7:9000", Attach("websmq", "tcp:192.0.2.7:9000", "length32")),
        ("websmq+cobs@unix:/run/mcu.sock", Attach("websmq", "unix:/run/mcu.sock", "cobs")),
    ],
)
def test_attach_forms(spec: str, expected: Attach) -> None:
    assert parse_attach(spec, reactor=reactor) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("websmq+ws@tcp:h:1",
         "--attach 'websmq+ws@tcp:h:1': an attached link needs a framing, not ws; "
         "use length32 or cobs"),
        ("websmq+x@tcp:h:1",
         "--attach 'websmq+x@tcp:h:1': unknown framing 'x'; use length32, lines or cobs"),
        ("websmq+lines@tcp:h:1",
         "--attach 'websmq+lines@tcp:h:1': websmq does not run over lines; use length32 or cobs"),
        ("mqtt@tcp:h:1",
         "--attach 'mqtt@tcp:h:1': unknown protocol 'mqtt'; use websmq, ubre, nydus or subble"),
        ("serial:/dev/ttyACM0",
         "--attach 'serial:/dev/ttyACM0': no '@' before the endpoint; use "
         "PROTOCOL[+FRAMING]@CLIENT_ENDPOINT, e.g. websmq@serial:/dev/ttyACM0"),
        ("websmq@", "--attach 'websmq@': no endpoint given, e.g. serial:/dev/ttyACM0"),
        ("websmq@serial:/dev/x:baudrate=fast",
         "--attach 'websmq@serial:/dev/x:baudrate=fast': bad client endpoint "
         "'serial:/dev/x:baudrate=fast': serial baudrate must be a number, not 'fast'"),
        # Over a C int: each open raised OverflowError, past the link's error handling, out
        # of the service's start (a fleet's board: out of the port watcher's listener).
        ("websmq@serial:vid=2e8a:baudrate=2147483648",
         "--attach 'websmq@serial:vid=2e8a:baudrate=2147483648': bad client endpoint "
         "'serial:vid=2e8a:baudrate=2147483648': serial baudrate must be at most 2147483647, "
         "not 2147483648"),
        ("websmq@tcp:h",
         "--attach 'websmq@tcp:h': bad client endpoint 'tcp:h': missing 1 required positional "
         "argument: 'port'"),
    ],
)
def test_attach_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_attach(spec, reactor=reactor)
    assert str(raised.value) == message


FULL_TOML = """\
[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:9000"

[[listen]]
protocol = "websmq"
transport = "ws"
endpoint = "tcp:9000"
path = "/mq/v1"

[[listen]]
protocol = "websmq"
transport = "cobs"
endpoint = "unix:/tmp/websmq.sock"

[[attach]]
protocol = "websmq"
endpoint = "serial:/dev/ttyACM0:baudrate=115200"

[hub]
queue_bytes = 65536
overflow = "disconnect"
max_subscriptions = 50

[websocket]
max_message_size = 4096
open_handshake_timeout = 3
auto_ping_interval = 20.0
auto_ping_timeout = 5.0
allowed_origins = ["https://example.com:443", "https://*.example.com:*"]
per_message_deflate = true
max_connections = 100

[stream]
max_message_size = 2048
max_connections = 10

[websmq]
wildcards = true
"""

FULL_CONFIG = Config(
    listeners=(
        Listener("websmq", "ws", "tcp:9000:interface=127.0.0.1", "/websmq"),
        Listener("websmq", "ws", "tcp:9000:interface=127.0.0.1", "/mq/v1"),
        Listener("websmq", "cobs", "unix:/tmp/websmq.sock"),
    ),
    attach=(Attach("websmq", "serial:/dev/ttyACM0:baudrate=115200", "cobs"),),
    hub=HubSettings(queue_bytes=65536, overflow="disconnect", max_subscriptions=50),
    websocket=WebSocketOptions(
        max_message_size=4096, open_handshake_timeout=3.0, auto_ping_interval=20.0,
        auto_ping_timeout=5.0, allowed_origins=("https://example.com:443", "https://*.example.com:*"),
        per_message_deflate=True, max_connections=100,
    ),
    stream=StreamOptions(max_message_size=2048, max_connections=10),
    websmq=WebsmqSettings(wildcards=True),
)


def test_toml_with_every_table() -> None:
    assert config_from_toml(FULL_TOML, reactor=reactor) == FULL_CONFIG


@pytest.mark.parametrize("config", [Config(), FULL_CONFIG, Config(listeners=(), attach=(
    Attach("websmq", "tcp:127.0.0.1:9", "length32"),))], ids=["defaults", "full", "attach-only"])
def test_toml_round_trip(config: Config) -> None:
    assert config_from_toml(config_to_toml(config), reactor=reactor) == config


def test_an_engineio_path_gets_the_trailing_slash_engineio_paths_have() -> None:
    assert parse_listen("nydus+engineio/rt@tcp:8765").path == "/rt/"
    assert parse_listen("nydus+engineio/rt/@tcp:8765").path == "/rt/"
    assert parse_listen("nydus+engineio@tcp:8765").path == "/engine.io/"
    assert parse_listen("nydus+ws@tcp:8765").path == "/nydus"


def test_a_protocol_without_a_default_path_needs_one_on_ws() -> None:
    register_protocol(ProtocolDescriptor(
        name="pathless", capture_code=254, server=lambda hub, settings: None,
        transports=frozenset({"ws"}),
    ))
    try:
        with pytest.raises(ConfigError, match="pathless has no default path: give one"):
            parse_listen("pathless+ws@tcp:8765")
        assert parse_listen("pathless+ws/p@tcp:8765").path == "/p"
    finally:
        unregister_protocol("pathless")


def test_nydus_settings_from_toml() -> None:
    config = config_from_toml(
        "[nydus]\ndebug = true\nmax_pending_invokes = 5\nhub_routes = false\n", reactor=reactor
    )
    assert config.protocol_options("nydus") == {
        "debug": True, "max_pending_invokes": 5, "hub_routes": False,
    }


def test_log_and_metrics_settings_from_toml() -> None:
    config = config_from_toml(
        '[log]\nlevel = "info"\nformat = "json"\nfile = "/var/log/wireproto.log"\n'
        '[metrics]\nenabled = false\npath = "/internal/metrics"\n',
        reactor=reactor,
    )
    assert (config.log.level, config.log.format, config.log.file) == (
        "info", "json", "/var/log/wireproto.log"
    )
    assert (config.metrics.enabled, config.metrics.path) == (False, "/internal/metrics")
    assert config_from_toml(config_to_toml(config), reactor=reactor) == config
    defaults = Config()
    assert (defaults.log.level, defaults.log.format, defaults.metrics.path) == (
        "warn", "text", "/metrics"
    )
    for text, message in [
        ('[log]\nlevel = "loud"\n', 'w.toml: log.level: unknown value "loud"; use debug, info, '
                                     "warn or error"),
        ('[log]\nformat = "xml"\n', 'w.toml: log.format: unknown value "xml"; use text or json'),
        ('[metrics]\npath = "metrics"\n', "w.toml: metrics: path 'metrics' must start with '/'"),
        ("[metrics]\nenabled = 1\n", "w.toml: metrics.enabled: expected true or false, got 1"),
    ]:
        with pytest.raises(ConfigError) as raised:
            config_from_toml(text, source="w.toml", reactor=reactor)
        assert str(raised.value) == message


def test_subble_settings_from_toml() -> None:
    config = config_from_toml(
        '[subble]\nallow_new_clients = false\nenforce_registry = true\n'
        'registry = "/var/lib/wireproto/subble.sqlite"\nallow = ["10.0.0.0/8", "::1"]\n'
        'deny = ["10.9.0.0/16"]\nregistry_ttl = 0\nregistry_mode = 0o640\n'
        'new_ids_per_minute = 5\nmax_ids_per_principal = 3\n',
        reactor=reactor,
    )
    assert config.protocol_options("subble") == {
        "allow_new_clients": False, "enforce_registry": True,
        "registry": "/var/lib/wireproto/subble.sqlite",
        "allow": ("10.0.0.0/8", "::1"), "deny": ("10.9.0.0/16",),
        "registry_ttl": 0.0, "registry_mode": 0o640, "new_ids_per_minute": 5,
        "max_ids_per_principal": 3,
    }
    for text, message in [
        ("registry_mode = 0o400", "does not let the broker read and write its own file"),
        ("registry_mode = 0o1777", "expected permissions such as 0o600"),
        ("registry_ttl = -1", "expected a number of seconds (0: never)"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            config_from_toml(f"[subble]\n{text}\n", reactor=reactor)
    with pytest.raises(ConfigError) as raised:
        config_from_toml('[subble]\ndeny = ["10.0.0.300/8"]\n', source="w.toml", reactor=reactor)
    assert str(raised.value) == (
        'w.toml: subble.deny: "10.0.0.300/8" is not an IP network; write one as 10.0.0.0/8 or ::1'
    )


def test_toml_listeners_as_strings() -> None:
    config = config_from_toml(
        'listen = ["websmq+ws@tcp:8765", "websmq+length32@tcp:8766", "ubre+ws@tcp:8765", '
        '"ubre+lines@tcp:8767", "nydus+engineio@tcp:8765", "nydus+lines@tcp:8768", '
        '"subble+ws@tcp:8765", "subble+length32@tcp:8769"]',
        reactor=reactor
    )
    assert config.listeners == DEFAULT_LISTENERS


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "wireproto.toml"
    path.write_text("")
    assert load_config(path, reactor=reactor) == Config()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lsten = []", "lsten: unknown key; use listen, attach, phyllo, acl, hub, websocket, "
                       "http, stream, websmq, ubre, nydus, subble, engineio, log, metrics, "
                       "capture, auth, limits, cluster, admin, devices, secrets or app (did you "
                       "mean 'listen'?)"),
        ('[[listen]]\nprotocol="websmq"\ntransport="ws"\nendpoint="tcp:1"\n'
         '[[listen]]\nprotocol="websmq"\ntransport="wss"\nendpoint="tcp:2"',
         "listen[2].transport: unknown transport 'wss'; use ws, engineio, length32, lines or cobs"),
        ('[[listen]]\nprotocol="websmq"\ntransport="ws"',
         "listen[1]: missing key 'endpoint'"),
        ('[[listen]]\nprotocol="websmq"\ntransport="ws"\nendpoint="tcp:1"\nport=3',
         "listen[1].port: unknown key; use protocol, transport, endpoint, path, identity, "
         "principal, allow or announce"),
        ('[[listen]]\nprotocol="websmq"\ntransport="ws"\nendpoint=8765',
         "listen[1].endpoint: expected a string, got 8765"),
        ('[[listen]]\nprotocol="websmq"\ntransport="lines"\nendpoint="tcp:1"',
         "listen[1].transport: websmq does not run over lines; use ws, length32 or cobs"),
        ('[[listen]]\nprotocol="websmq"\ntransport="length32"\nendpoint="tcp:1"\npath="/x"',
         "listen[1].path: a path is only for ws and engineio listeners, not length32"),
        ('[[listen]]\nprotocol="websmq"\ntransport="ws"\nendpoint="tcp:1"\npath="x"',
         "listen[1].path: path 'x' must start with '/'"),
        ('listen = ["websmq+wss@tcp:1"]',
         "listen[1]: 'websmq+wss@tcp:1': unknown transport 'wss'; use ws, engineio, length32, "
         "lines or cobs"),
        ('listen = "websmq+ws@tcp:1"',
         'listen: expected [[listen]] tables or a list of strings, got "websmq+ws@tcp:1"'),
        ('listen = [3]', "listen[1]: expected a table or a string, got 3"),
        ('listen = ["websmq+length32@tcp:5", "websmq+ws@tcp:5"]',
         "listen[2].endpoint: tcp:5:interface=127.0.0.1 is already used by listen[1] "
         "(websmq over length32); only ws and engineio listeners may share an endpoint"),
        ('listen = ["websmq+ws@tcp:5", "websmq+ws@tcp:5"]',
         "listen[2].path: /websmq on tcp:5:interface=127.0.0.1 is already served by listen[1]"),
        ('listen = ["websmq+length32@unix:/tmp/a", "websmq+cobs@unix:/tmp/a"]',
         "listen[2].endpoint: unix:/tmp/a is already used by listen[1] (websmq over length32); "
         "only ws and engineio listeners may share an endpoint"),
        ("listen = []", "no listeners and nothing attached: nothing to serve"),
        ('[[attach]]\nprotocol="websmq"\nendpoint="serial:/dev/x"\nframing="ws"',
         "attach[1].framing: an attached link needs a framing, not ws; use length32 or cobs"),
        ('[[attach]]\nendpoint="serial:/dev/x"', "attach[1]: missing key 'protocol'"),
        ('[[attach]]\nprotocol="websmq"\nendpoint="serial:/dev/x"\nbaudrate=9600',
         "attach[1].baudrate: unknown key; use protocol, endpoint, framing, principal, name, "
         "each_board, max_boards or prefix"),
        ("[hub]\nqueue_bytes = 'lots'", 'hub.queue_bytes: expected an integer, got "lots"'),
        ("[hub]\nqueue_bytes = true", "hub.queue_bytes: expected an integer, got true"),
        ("[hub]\nqueue_bytes = 0", "hub.queue_bytes: must be a positive integer, not 0"),
        ("[hub]\nretained_examined_per_second = -1",
         "hub.retained_examined_per_second: expected a count (0: no limit), got -1"),
        ("[hub]\noverflow = 'drop-newest'",
         'hub.overflow: unknown policy "drop-newest"; use drop-oldest or disconnect'),
        ("[hub]\nqueue = 1", "hub.queue: unknown key; use queue_bytes, overflow, "
                             "max_subscriptions, max_topic_length, max_subscription_bytes, "
                             "max_total_subscription_bytes, retain, max_retained, "
                             "max_retained_bytes, retained_examined_per_second, retain_file, "
                             "max_document_elements or max_document_depth "
                             "(did you mean 'queue_bytes'?)"),
        ("[hub]\nretain = ['a/#/b']", "hub.retain: "),
        ("hub = 3", "hub: expected a table ([hub]), got 3"),
        ("[websocket]\nauto_ping_interval = -1",
         "websocket.auto_ping_interval: expected a number of seconds (0: never), got -1"),
        ("[websocket]\nopen_handshake_timeout = 'soon'",
         'websocket.open_handshake_timeout: expected a number of seconds, got "soon"'),
        ("[websocket]\nallowed_origins = 'https://example.com'",
         'websocket.allowed_origins: expected a list of strings, got "https://example.com"'),
        ("[websocket]\nallowed_origins = ['https://example.com']",
         "websocket: allowed origin 'https://example.com' would never match: origins are "
         "matched as 'scheme://host:port', so write 'https://example.com:443' or "
         "'https://example.com:*'"),
        ("[websocket]\nper_message_deflate = 1",
         "websocket.per_message_deflate: expected true or false, got 1"),
        ("[websocket]\nmax_message = 1",
         "websocket.max_message: unknown key; use max_message_size, open_handshake_timeout, "
         "close_handshake_timeout, auto_ping_interval, auto_ping_timeout, allowed_origins, "
         "per_message_deflate or max_connections (did you mean 'max_message_size'?)"),
        ("[stream]\nframing = 'cobs'",
         "stream.framing: unknown key; use max_message_size, max_connections, keepalive_idle, "
         "keepalive_interval, keepalive_count or idle_timeout"),
        ("[websmq]\nwildcard = true",
         "websmq.wildcard: unknown key; use wildcards (did you mean 'wildcards'?)"),
        ("[hub\n", "not valid TOML: "),
    ],
)
def test_toml_errors_name_the_file_and_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_toml(text, source="wireproto.toml", reactor=reactor)
    assert str(raised.value).startswith(f"wireproto.toml: {message}")
    if not message.endswith(": "):
        assert str(raised.value) == f"wireproto.toml: {message}"


def test_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as raised:
        load_config(missing)
    assert str(raised.value) == f"{missing}: cannot read the config file: No such file or directory"
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError) as raised:
        load_config(binary)
    assert str(raised.value).startswith(f"{binary}: not UTF-8 text")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[listen]]\nprotocol = "websmq"\ntransport = "wss"\nendpoint = "tcp:1"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(bad)
    assert str(raised.value) == (
        f"{bad}: listen[1].transport: unknown transport 'wss'; use ws, engineio, length32, "
        "lines or cobs"
    )


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "wireproto.toml"
    path.write_text(FULL_TOML)
    assert build_config(config_file=path, reactor=reactor) == FULL_CONFIG
    config = build_config(
        config_file=path, listen=["websmq+length32@tcp:0"], attach=["websmq@tcp:127.0.0.1:9"],
        queue_bytes=1024, overflow="drop-oldest", reactor=reactor,
    )
    assert config.listeners == (Listener("websmq", "length32", "tcp:0:interface=127.0.0.1"),)
    assert config.attach == (Attach("websmq", "tcp:127.0.0.1:9", "length32"),)
    assert config.hub == HubSettings(queue_bytes=1024, overflow="drop-oldest",
                                     max_subscriptions=50)
    assert config.websocket == FULL_CONFIG.websocket
    assert build_config(wildcards=True).websmq == WebsmqSettings(wildcards=True)
    # Two stream listeners on port 0 get a port each; two ws listeners on one endpoint share it.
    assert len(build_config(listen=["websmq+length32@tcp:0", "websmq+cobs@tcp:0",
                                    "websmq+ws@tcp:0", "websmq+ws/b@tcp:0"]).listeners) == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue_bytes": 0}, "--queue-bytes: must be a positive number of bytes, not 0"),
        ({"overflow": "never"},
         '--overflow: unknown policy "never"; use drop-oldest or disconnect'),
        ({"listen": ["websmq+length32@tcp:9", "websmq+ws@tcp:9"]},
         "--listen 'websmq+ws@tcp:9': tcp:9:interface=127.0.0.1 is already used by "
         "--listen 'websmq+length32@tcp:9' (websmq over length32); only ws and engineio "
         "listeners may share an endpoint"),
        ({"config_file": "/nonexistent/wireproto.toml"},
         "/nonexistent/wireproto.toml: cannot read the config file: No such file or directory"),
    ],
)
def test_command_line_errors(options: dict, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build_config(reactor=reactor, **options)
    assert str(raised.value) == message


def test_port_zero_is_ephemeral() -> None:
    assert is_ephemeral("tcp:0:interface=127.0.0.1")
    assert is_ephemeral("ssl:port=0:privateKey=k.pem")
    assert not is_ephemeral("tcp:8765")
    assert not is_ephemeral("unix:/tmp/0")


def test_the_tables_follow_the_option_classes() -> None:
    """A field added to WebSocketOptions (or the others) must be readable from TOML too, or be
    marked as no config key."""
    from wireproto.config.tables import config_tables
    from wireproto.settings import table_readers

    for name, kind in config_tables().items():
        not_keys = [item.name for item in fields(kind) if not item.metadata.get("in_config", True)]
        assert sorted([*table_readers(kind), *not_keys]) == sorted(
            item.name for item in fields(kind)), name
    for spec in server_protocols().values():
        assert spec.transports <= set(TRANSPORTS)
        assert hasattr(Config(), spec.name), f"no [{spec.name}] table for {spec.name}'s options"


def test_a_key_whose_type_says_too_little_needs_a_reader() -> None:
    from dataclasses import dataclass

    from wireproto.settings import table_readers

    @dataclass(frozen=True)
    class Settings:
        ports: list[int] = ()  # type: ignore[assignment]

    with pytest.raises(TypeError, match="'ports'.*needs setting"):
        table_readers(Settings)


def test_the_toml_example_in_the_docs_is_valid() -> None:
    page = (DOCS / "running.md").read_text(encoding="utf-8")
    examples = re.findall(r"```toml\n(.*?)```", page, re.DOTALL)
    assert examples, "docs/running.md has a ```toml example"
    for example in examples:
        config_from_toml(example, source="docs/running.md", reactor=reactor)


def test_no_listener_may_sit_at_the_metrics_path() -> None:
    for spec in ("websmq+ws/metrics@tcp:1", "ubre+ws/metrics/ubre@tcp:1"):
        with pytest.raises(ConfigError, match=r"^w\.toml: listen\[1\]\.path: /metrics.* is where "
                                              r"\[metrics\] path /metrics is served"):
            config_from_toml(f'listen = ["{spec}"]\n', source="w.toml", reactor=reactor)
    config_from_toml('listen = ["websmq+ws/metrics@tcp:1"]\n[metrics]\nenabled = false\n',
                     reactor=reactor)
    config_from_toml('listen = ["websmq+ws/metricsx@tcp:1", "websmq+length32@tcp:2"]\n',
                     reactor=reactor)
    with pytest.raises(ConfigError, match=r"/ubre is where \[metrics\] path /ubre is served"):
        config_from_toml('[metrics]\npath = "/ubre"\n', source="w.toml", reactor=reactor)
