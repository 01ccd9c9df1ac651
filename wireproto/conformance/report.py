"""What a run of a kit reports (docs/conformance.md, "Reading the report"): a line per case as it
finishes, a one-line summary, the exit status, and with ``--report DIR`` a JSON report of a
documented, versioned schema and one self-contained HTML page.

Everything a server sent reaches the page escaped, and no credential of the command (a header's
value, a token, a password) reaches any of them: `Scrubber` takes them out of every text and
every recorded byte first.
"""

from __future__ import annotations

import errno
import html
import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NotRequired, TypedDict

from wireproto.conformance.catalogue import CaseResult, count
from wireproto.conformance.model import KIT_VERSION, Exchange, Outcome
from wireproto.conformance.probe import masked_forms
from wireproto.redaction import REDACTED, redact_text

__all__ = ["SCHEMA", "SCHEMA_VERSION", "HEX_LIMIT", "Run", "Scrubber", "case_line",
           "check_directory", "exit_status", "printable", "reason_shown", "summary_line",
           "to_html", "to_json", "write_report"]

SCHEMA = "wireproto-conformance-report"
SCHEMA_VERSION = 1
# The bytes of one exchange a report keeps (its length is always the whole length).
HEX_LIMIT = 4096
# The characters of a case's reason a line or a report keeps: a reason quoting what a server
# sent cannot make either as large as the server likes.
REASON_LIMIT = 2000

EXIT_PASSED = 0
EXIT_FAILED = 1

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without anything a terminal would act on (escape sequences, carriage returns,
    direction overrides): each such character shown as its escape."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1] if ord(match.group()) < 0x100
                        else f"\\u{ord(match.group()):04x}", text)


def reason_shown(text: str, scrub: Scrubber) -> str:
    """A case's reason as a line or a report shows it: no credential, at most REASON_LIMIT
    characters."""
    shown = scrub.text(text)
    if len(shown) > REASON_LIMIT:
        shown = shown[:REASON_LIMIT] + f"... ({len(shown) - REASON_LIMIT} more characters)"
    return shown


class Scrubber:
    """Takes the command's credentials out of what a report or a line shows: each secret
    (a header's value, a token, a password, the Basic pair) becomes ``***`` in text and in
    recorded bytes, and a URL's credentials are redacted (wireproto.redaction). A server may
    send a secret back in another form, which a reason or the recorded bytes then hold: its
    hexadecimal (a case shows unknown bytes so), its escaped repr, and base64 (Engine.IO's
    binary packets) are taken out too."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first: a token inside "Bearer TOKEN" is taken out with its prefix.
        self.secret_bytes = masked_forms(secrets)
        self.secrets = [form.decode("utf-8", "replace") for form in self.secret_bytes]

    def text(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return redact_text(text)

    def data(self, data: bytes) -> bytes:
        for secret in self.secret_bytes:
            data = data.replace(secret, REDACTED.encode())
        return data


@dataclass
class Run:
    """One run of a kit against one implementation, as its report tells it. `target` is the
    address as shown (its credentials redacted): the server's or the device's, or where the kit
    listened for a client; `error` says why a run could not judge it. `mode` is what was judged
    (server, client, device); for a client, `client_started_by_kit` says whether the kit
    started it (--run, whose command is never kept: it may hold a secret)."""

    protocol: str
    target: str
    started: datetime
    duration: float = 0.0
    results: list[CaseResult] = field(default_factory=list)
    status: int = EXIT_PASSED
    error: str = ""
    scrubber: Scrubber = field(default_factory=Scrubber)
    mode: str = "server"
    client_started_by_kit: bool | None = None


def failed_ids(results: Sequence[CaseResult]) -> list[str]:
    return [result.case.id for result in results if result.outcome is Outcome.FAIL]


def exit_status(results: Sequence[CaseResult]) -> int:
    """0 when no case failed (a SHOULD not met is non-strict, not failed), else 1."""
    return EXIT_FAILED if failed_ids(results) else EXIT_PASSED


def case_line(result: CaseResult, scrubber: Scrubber | None = None) -> str:
    """``pass        websmq.topic.longest  A topic of ...``, then the reason if there is one."""
    scrub = scrubber or Scrubber()
    line = f"{result.outcome.value:<12}{result.case.id}  {result.case.title}"
    if result.reason:
        line += f": {reason_shown(result.reason, scrub)}"
    return printable(" ".join(line.split()) if "\n" in line else line)


def summary_line(run: Run) -> str:
    """``websmq at ws://...: 42 cases, 40 pass, 1 fail, 1 non-strict, 0 information; MUST
    failed: websmq.will.published`` (or ``every MUST passed``); ``websmq client at ...`` where
    the kit listened for a client, ``phyllo device at ...`` for a device."""
    totals = count(run.results)
    parts = ", ".join(f"{totals[outcome]} {outcome.value}" for outcome in Outcome)
    failed = failed_ids(run.results)
    verdict = f"MUST failed: {', '.join(failed)}" if failed else "every MUST passed"
    target = run.scrubber.text(run.target)
    judged = run.protocol if run.mode == "server" else f"{run.protocol} {run.mode}"
    return printable(f"{judged} at {target}: {len(run.results)} cases, {parts}; {verdict}")


# -- JSON -----------------------------------------------------------------------------------------


class ExchangeRecord(TypedDict):
    connection: int
    direction: str
    at: float
    binary: bool
    length: int | None
    hex: str | None
    truncated: bool
    text: str


class CaseRecord(TypedDict):
    id: str
    title: str
    group: str
    section: str
    decision: str | None
    level: str
    timeout: float
    harmful: bool
    outcome: str
    reason: str
    duration: float
    exchanges: list[ExchangeRecord]


class ReportRecord(TypedDict):
    schema: str
    schema_version: int
    kit_version: str
    wireproto_version: str
    protocol: str
    mode: str
    target: str
    started: str
    duration: float
    summary: dict[str, int]
    status: int
    error: str | None
    cases: list[CaseRecord]
    client_started_by_kit: NotRequired[bool]


def _exchange(exchange: Exchange, scrub: Scrubber) -> ExchangeRecord:
    record = ExchangeRecord(connection=exchange.connection, direction=exchange.direction,
                            at=exchange.at, binary=exchange.binary, length=None, hex=None,
                            truncated=False, text=scrub.text(exchange.text))
    if exchange.data is not None:
        data = scrub.data(exchange.data)
        kept = data[:HEX_LIMIT]
        length = max(exchange.length, len(exchange.data))
        record["length"], record["hex"] = length, kept.hex()
        # cut by the record or by the report; a credential taken out shortens it, and is no cut
        record["truncated"] = length > HEX_LIMIT or len(exchange.data) < length
        if not exchange.text and not exchange.binary:
            record["text"] = kept.decode("utf-8", "replace")
    return record


def to_json(run: Run) -> ReportRecord:
    """The report as the JSON object docs/conformance.md documents ("The JSON report")."""
    from wireproto import __version__

    scrub = run.scrubber
    totals = count(run.results)
    report: ReportRecord = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kit_version": KIT_VERSION,
        "wireproto_version": __version__,
        "protocol": run.protocol,
        "mode": run.mode,
        "target": scrub.text(run.target),
        "started": run.started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "duration": round(run.duration, 3),
        "summary": {outcome.value: totals[outcome] for outcome in Outcome},
        "status": run.status,
        "error": scrub.text(run.error) or None,
        "cases": [{
            "id": result.case.id,
            "title": result.case.title,
            "group": result.case.group,
            "section": result.case.section,
            "decision": result.case.decision or None,
            "level": result.case.level.value,
            "timeout": result.case.timeout,
            "harmful": result.case.harmful,
            "outcome": result.outcome.value,
            "reason": reason_shown(result.reason, scrub),
            "duration": result.duration,
            "exchanges": [_exchange(exchange, scrub) for exchange in result.exchanges],
        } for result in run.results],
    }
    if run.mode == "client":
        report["client_started_by_kit"] = bool(run.client_started_by_kit)
    return report


# -- HTML -----------------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left;vertical-align:top}
details{margin:2px 0;border:1px solid #ddd;border-radius:3px}
summary{cursor:pointer;padding:3px 6px}
.o{display:inline-block;width:7.5em;font-weight:bold}
.pass{color:#176f2c}.fail{color:#b00020}.non-strict{color:#a15c00}.information{color:#1d4f91}
.body{padding:4px 12px 10px}pre{margin:2px 0;font:12px/1.3 ui-monospace,monospace;
white-space:pre-wrap;word-break:break-all;background:#f6f6f6;padding:4px}
.ev{color:#555;font-style:italic}code{font:12px ui-monospace,monospace}
"""


def _e(text: object) -> str:
    """`text` for the page: markup escaped, and control characters shown as escapes."""
    return html.escape(printable(str(text)), quote=True)


def _dump(data: bytes) -> str:
    """A hex dump, 16 bytes a row, with each row's printable ASCII beside it."""
    rows = []
    for offset in range(0, len(data), 16):
        chunk = data[offset:offset + 16]
        shown = "".join(chr(byte) if 0x20 <= byte < 0x7f else "." for byte in chunk)
        rows.append(f"{offset:04x}  {chunk.hex(' '):<47}  {shown}")
    return "\n".join(rows)


def _exchange_html(exchange: ExchangeRecord) -> str:
    head = (f"#{exchange['connection']} {exchange['direction']} at {exchange['at']:.3f} s")
    if exchange["hex"] is None:
        return f'<tr><td>{_e(head)}</td><td class="ev">{_e(exchange["text"])}</td></tr>'
    kind = "binary" if exchange["binary"] else "text"
    more = f", first {HEX_LIMIT} shown" if exchange["truncated"] else ""
    note = f" ({exchange['text']})" if exchange["text"] and exchange["binary"] else ""
    dump = _dump(bytes.fromhex(exchange["hex"])) or "(empty)"
    size = f"{exchange['length']} bytes, {kind}{more}"
    return (f"<tr><td>{_e(head)}</td><td>{_e(size)}{_e(note)}<pre>{_e(dump)}</pre></td>"
            "</tr>")


def _judged(report: ReportRecord) -> str:
    """What the run judged, in words: ``a client, started by the kit for each case``."""
    if report["mode"] != "client":
        return f"a {report['mode']} at the address above"
    started = ("started by the kit for each case (--run)"
               if report.get("client_started_by_kit") else "started by hand")
    return f"a client, {started}, that connected to the kit at the address above"


def to_html(run: Run) -> str:
    """The report as one page that needs nothing else: no script, no style sheet, no image.
    Every text is escaped, so a server's bytes are shown, never read as markup."""
    report = to_json(run)
    groups: dict[str, list[CaseRecord]] = {}
    for case in report["cases"]:
        groups.setdefault(case["group"], []).append(case)
    summary = "".join(f'<tr><td class="{_e(name)}">{_e(name)}</td><td>{number}</td></tr>'
                      for name, number in report["summary"].items())
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        'style-src \'unsafe-inline\'">',
        f"<title>{_e(report['protocol'])} conformance of {_e(report['target'])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{_e(report['protocol'])} conformance: {_e(report['target'])}</h1>",
        f"<p>{_e(summary_line(run))}</p>",
        f"<table><tr><th>started</th><td>{_e(report['started'])}</td></tr>"
        f"<tr><th>duration</th><td>{report['duration']} s</td></tr>"
        f"<tr><th>judged</th><td>{_e(_judged(report))}</td></tr>"
        f"<tr><th>exit status</th><td>{report['status']}</td></tr>"
        f"<tr><th>kit</th><td>{_e(report['kit_version'])} (wireproto "
        f"{_e(report['wireproto_version'])}), report schema {report['schema_version']}</td></tr>"
        f"</table>",
    ]
    if report["error"]:
        parts.append(f'<p class="fail">could not run: {_e(report["error"])}</p>')
    parts.append(f"<table>{summary}</table>")
    checked = f", harmful: the {report['mode']} checked after it"
    for group, cases in groups.items():
        parts.append(f'<h2 id="{_e(group)}">{_e(group)}</h2>')
        for case in cases:
            opened = " open" if case["outcome"] == Outcome.FAIL.value else ""
            decision = (f"<tr><th>decided in</th><td><code>{_e(case['decision'])}</code></td>"
                        "</tr>" if case["decision"] else "")
            rows = "".join(map(_exchange_html, case["exchanges"]))
            parts.append(
                f'<details id="{_e(case["id"])}"{opened}><summary>'
                f'<span class="o {_e(case["outcome"])}">{_e(case["outcome"])}</span> '
                f'<code>{_e(case["id"])}</code> {_e(case["title"])}</summary><div class="body">'
                f"<table><tr><th>level</th><td>{_e(case['level'])}</td></tr>"
                f"<tr><th>spec section</th><td>{_e(case['section'])}</td></tr>{decision}"
                f"<tr><th>reason</th><td>{_e(case['reason'] or '-')}</td></tr>"
                f"<tr><th>duration</th><td>{case['duration']} s (timeout {case['timeout']} s"
                f"{checked if case['harmful'] else ''})</td>"
                f"</tr></table><table>{rows}</table></div></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


# -- writing --------------------------------------------------------------------------------------


def check_directory(directory: str) -> Path:
    """`directory`, made if it is missing, once a file can be written in it; OSError (with
    what is wrong) when it cannot, so a run that could not keep its report never starts."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory")
    path.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".conform-", delete=True):
            pass
    except OSError as error:
        raise OSError(error.errno, f"cannot write a file in it ({error.strerror})") from None
    return path


def _write(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: a reader never sees half a report."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_report(directory: str, run: Run) -> tuple[Path, Path]:
    """Write DIR/report.json and DIR/index.html; their paths."""
    path = check_directory(directory)
    report, page = path / "report.json", path / "index.html"
    _write(report, json.dumps(to_json(run), indent=2) + "\n")
    _write(page, to_html(run))
    return report, page
