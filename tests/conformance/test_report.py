"""The report: the lines, the JSON of its documented schema, the HTML page with a hostile server's
bytes escaped, no credential anywhere, and the writing of DIR."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conformance.sample_kit import kit
from wireproto import __version__
from wireproto.conformance.catalogue import CaseResult
from wireproto.conformance.model import KIT_VERSION, Exchange, Outcome
from wireproto.conformance.report import (
    HEX_LIMIT,
    Run,
    Scrubber,
    case_line,
    check_directory,
    exit_status,
    printable,
    summary_line,
    to_html,
    to_json,
    write_report,
)

CASES = {case.id.removeprefix("websmq.sample."): case for case in kit.cases}
HOSTILE = (b'</pre></td></tr></table></details><script>alert("x")</script>'
           b'<img src=http://evil/x onerror=alert(1)><a href="javascript:x">\x1b[2J\xff\xfe')
SECRET = "s3cret-t0ken"


def run(*results: CaseResult, status: int = 1) -> Run:
    return Run("websmq", "ws://127.0.0.1:1/websmq?access_token=q-s3cret",
               datetime(2026, 11, 27, 3, 39, 29, tzinfo=UTC), 1.25, list(results), status,
               scrubber=Scrubber([f"Bearer {SECRET}", SECRET, "x"]))


def hostile_result() -> CaseResult:
    return CaseResult(CASES["hostile"], Outcome.FAIL,
                      f"the server sent {HOSTILE.decode('utf-8', 'replace')} {SECRET}", 0.5, [
                          Exchange(1, "event", 0.0, text="connected"),
                          Exchange(1, "received", 0.01, HOSTILE, binary=False),
                          Exchange(1, "received", 0.02, HOSTILE + SECRET.encode()),
                          Exchange(1, "received", 0.03, b"\x00" * (HEX_LIMIT + 10)),
                          Exchange(1, "sent", 0.04, b"\x01\x02", text="raw bytes"),
                      ])


def test_the_json_report_has_every_documented_field() -> None:
    report = to_json(run(hostile_result(), CaseResult(CASES["delivered"], Outcome.PASS)))
    assert list(report) == ["schema", "schema_version", "kit_version", "wireproto_version",
                            "protocol", "mode", "target", "started", "duration", "summary",
                            "status", "error", "cases"]
    assert report["schema"] == "wireproto-conformance-report" and report["schema_version"] == 1
    assert report["kit_version"] == KIT_VERSION and report["wireproto_version"] == __version__
    assert report["target"] == "ws://127.0.0.1:1/websmq?access_token=***"
    assert report["started"] == "2026-11-27T03:39:29Z" and report["mode"] == "server"
    assert report["summary"] == {"pass": 1, "fail": 1, "non-strict": 0, "information": 0}
    case = report["cases"][0]
    assert list(case) == ["id", "title", "group", "section", "decision", "level", "timeout",
                          "harmful", "outcome", "reason", "duration", "exchanges"]
    assert (case["id"], case["group"], case["level"], case["outcome"]) == (
        "websmq.sample.hostile", "websmq.sample", "information", "fail")
    event, text, binary, large, raw = case["exchanges"]
    assert event == {"connection": 1, "direction": "event", "at": 0.0, "binary": True,
                     "length": None, "hex": None, "truncated": False, "text": "connected"}
    assert text["hex"] == HOSTILE.hex() and text["text"] == HOSTILE.decode("utf-8", "replace")
    assert large["length"] == HEX_LIMIT + 10 and len(large["hex"]) == 2 * HEX_LIMIT
    assert large["truncated"] is True and raw["text"] == "raw bytes"
    # A secret the server sent back is taken out of the bytes too.
    assert bytes.fromhex(binary["hex"]).endswith(b"***") and binary["length"] == len(
        HOSTILE) + len(SECRET)
    json.dumps(report)  # it is JSON as it is


def test_no_credential_anywhere() -> None:
    report = run(hostile_result())
    everything = (json.dumps(to_json(report)) + to_html(report) + summary_line(report)
                  + case_line(report.results[0], report.scrubber))
    for secret in (SECRET, "q-s3cret", SECRET.encode().hex()):
        assert secret not in everything, secret


class Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)


def test_a_credential_sent_back_in_another_form_is_taken_out_too() -> None:
    """A server that echoes the token inside bytes a case shows in hex, or in base64 (an
    Engine.IO binary packet), at any alignment: no form of it reaches a line or the report."""
    import base64
    import binascii

    def decodes_to_the_secret(text: str) -> bool:
        for piece in text.split("***"):
            for skip in range(4):
                chunk = piece[skip:]
                try:
                    decoded = base64.b64decode(chunk[:len(chunk) // 4 * 4])
                except (binascii.Error, ValueError):
                    continue
                if b"Secret" in decoded:
                    return True
        return False

    secret = "SuperSecretToken123"
    scrubber = Scrubber([secret])
    for prefix in (b"", b"?", b"?\xff", b"?\xff\x00"):
        sent = prefix + b"Bearer " + secret.encode() + b" and more"
        assert b"Secret" not in scrubber.data(sent)
        for shown in (sent.hex(), sent.hex().upper(), repr(sent)):
            cleaned = scrubber.text(shown)
            assert "Secret" not in cleaned and b"Secret".hex() not in cleaned.lower(), cleaned
        encoded = base64.b64encode(sent).decode()
        assert decodes_to_the_secret(encoded)  # the check can fail
        assert not decodes_to_the_secret(scrubber.text(encoded)), scrubber.text(encoded)
        assert not decodes_to_the_secret(scrubber.data(encoded.encode()).decode())


def test_a_hostile_servers_bytes_are_shown_never_read_as_markup() -> None:
    page = to_html(run(hostile_result()))
    markup = Markup()
    markup.feed(page)
    assert markup.tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p",
                           "table", "tr", "th", "td", "details", "summary", "span", "code",
                           "div", "pre"}, markup.tags
    assert markup.attributes <= {"lang", "charset", "http-equiv", "content", "class", "id",
                                 "open"}, markup.attributes
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<details") == page.count("</details>") == 1
    assert "default-src 'none'" in page
    assert "\x1b" not in page and "\\x1b[2J" in page
    # The hex dump of the text message, its printable column escaped.
    assert ("0000  3c 2f 70 72 65 3e 3c 2f 74 64 3e 3c 2f 74 72 3e  "
            "&lt;/pre&gt;&lt;/td&gt;&lt;/tr&gt;") in page


def test_the_lines_escape_what_a_terminal_would_act_on() -> None:
    result = hostile_result()
    line = case_line(result, Scrubber([SECRET]))
    assert "\x1b" not in line and "\\x1b[2J" in line and "***" in line
    assert line.startswith("fail        websmq.sample.hostile  The server's first message")
    assert printable("a\rb\u202ec\td") == "a\\rb\\u202ec\td"
    passed = CaseResult(CASES["delivered"], Outcome.PASS)
    assert case_line(passed) == ("pass        websmq.sample.delivered  A publish reaches a "
                                 "subscriber whole")


def test_a_reason_is_bounded() -> None:
    result = CaseResult(CASES["impossible"], Outcome.FAIL, "x" * 10**6)
    line = case_line(result)
    assert len(line) < 2200 and line.endswith(f"... ({10**6 - 2000} more characters)")
    assert to_json(run(result))["cases"][0]["reason"].endswith("more characters)")


def test_the_summary_and_the_status() -> None:
    should = CaseResult(CASES["never-answers"], Outcome.NON_STRICT, "nothing")
    passed = CaseResult(CASES["delivered"], Outcome.PASS)
    assert exit_status([passed, should]) == 0
    assert summary_line(run(passed, should)) == (
        "websmq at ws://127.0.0.1:1/websmq?access_token=***: 2 cases, 1 pass, 0 fail, "
        "1 non-strict, 0 information; every MUST passed")
    failed = CaseResult(CASES["impossible"], Outcome.FAIL, "nothing")
    assert exit_status([passed, failed]) == 1
    assert summary_line(run(passed, failed)).endswith(
        "1 fail, 0 non-strict, 0 information; MUST failed: websmq.sample.impossible")


def test_write_report_makes_dir_and_replaces_both_files(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    report, page = write_report(str(directory), run(hostile_result()))
    assert json.loads(report.read_text())["status"] == 1
    assert page.read_text().startswith("<!DOCTYPE html>")
    write_report(str(directory), run(status=0))
    assert json.loads(report.read_text())["status"] == 0
    assert sorted(path.name for path in directory.iterdir()) == ["index.html", "report.json"]


def test_a_dir_that_cannot_hold_the_report_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(NotADirectoryError, match="not a directory"):  # it says why
        check_directory(str(file))
    with pytest.raises(NotADirectoryError):
        check_directory(str(file / "under"))


def test_a_token_in_a_jwt_query_parameter_is_not_shown() -> None:
    """`?jwt=` is where many servers take a browser's token: it is redacted as `?token=` is."""
    shown = Scrubber().text("could not connect to ws://h:1/websmq?jwt=eyJ.x.y&v=2")
    assert shown == "could not connect to ws://h:1/websmq?jwt=***&v=2"


def test_what_the_server_sends_back_is_masked_before_any_case_reads_it() -> None:
    """A case cuts what it shows of a message (60 bytes, say), and a credential straddling the
    cut would show in part past any later scrubbing: the probe masks every form of each
    credential the moment the bytes arrive, keeping lengths, so that no cut can hold one."""
    import base64
    import json
    from urllib.parse import quote

    from wireproto.cli import build_parser
    from wireproto.conformance.command import _target

    args = build_parser("conform").parse_words([
        "conform", "server", "ws://127.0.0.1:1/websmq?jwt=QueryJwtSecret777",
        "--token", "SuperSecretToken123"])
    target, _ = _target(args, "websmq")
    for secret in ("SuperSecretToken123", "QueryJwtSecret777"):
        raw = secret.encode()
        for form in (raw, raw.hex().encode(), raw.hex().upper().encode(),
                     quote(secret).encode(), json.dumps(secret).encode()):
            sent = b"\x3f\xff" + form + b" and more"
            masked = target.mask(sent)
            assert len(masked) == len(sent) and b"Secret" not in masked, masked
            assert b"Secret".hex().encode() not in masked.lower(), masked
        for skew in range(3):
            encoded = base64.b64encode(b"?" * skew + b"Bearer " + raw + b" and more")
            assert b"Secret" not in base64.b64decode(
                target.mask(encoded).replace(b"*", b"A")), skew
