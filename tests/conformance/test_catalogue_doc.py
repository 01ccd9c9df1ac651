"""docs/conformance.md's catalogue is what the kits hold (catalogue_doc.render), every kit in KITS
is well formed (a liveness check; ids, titles, sections; timeouts under 10 s; each decision a
heading of docs/ that exists), and `conform server --list` prints each of them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.conformance import sample_kit
from tests.test_doc_contents import anchor
from wireproto.cli import main
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.catalogue_doc import BEGIN, END, catalogues, render, replace
from wireproto.conformance.command import catalogue_lines
from wireproto.conformance.kits import CLIENT_KITS, DEVICE_KITS, KITS, kit

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "conformance.md"


def headings(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def check_decision(decision: str) -> None:
    path, hash_sign, target = decision.partition("#")
    assert path.startswith("docs/") and hash_sign and target, decision
    page = ROOT / path
    assert page.is_file(), f"{decision}: no {path}"
    assert target in headings(page), f"{decision}: {path} has no heading with that anchor"


def installed(protocol: str) -> Catalogue:
    assert importlib.util.find_spec(KITS[protocol]) is not None, f"{KITS[protocol]} is missing"
    return kit(protocol)


def test_the_page_holds_the_catalogue_the_kits_give() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert page.count(BEGIN) == 1 and page.count(END) == 1
    assert replace(page, render()) == page, (
        "docs/conformance.md's catalogue is out of step with the kits: run "
        "python -m wireproto.conformance.catalogue_doc docs/conformance.md")


@pytest.mark.parametrize("protocol", list(KITS))
def test_each_kit_is_well_formed_and_cites_what_exists(protocol: str) -> None:
    catalogue = installed(protocol)
    assert catalogue.protocol == protocol and catalogue.alive is not None
    assert (ROOT / catalogue.docs).is_file(), catalogue.docs
    assert catalogue.cases
    for case in catalogue.cases:
        assert case.id.startswith(f"{protocol}.") and case.id.count(".") >= 2, case.id
        assert case.title.strip() and case.section.strip(), case.id
        assert 0 < case.timeout < 10, case.id
        if case.decision:
            check_decision(case.decision)
    assert catalogue in catalogues()


def test_the_sample_kits_decision_is_checked_and_rendered() -> None:
    (decided,) = [case for case in sample_kit.kit.cases if case.decision]
    check_decision(decided.decision)
    with pytest.raises(AssertionError, match="no heading"):
        check_decision("docs/websmq.md#what-we-never-decided")
    text = render([sample_kit.kit])
    assert text.startswith("### WEBSMQ: `websmq`\n\n8 cases (MUST, SHOULD, information); "
                           "wireproto's decisions in [websmq.md](websmq.md).\n")
    assert ("| `websmq.sample.echo-back` | SHOULD | A publisher hears nothing of its own "
            "publish on a topic it does not subscribe to | Message format | "
            "[websmq.md#what-we-decided](websmq.md#what-we-decided) |\n") in text
    assert render([]) == "No kit is installed.\n"


def test_replace_puts_the_catalogue_between_the_markers_alone() -> None:
    page = f"# t\n\n{BEGIN}\nold\n{END}\n\n## After\n"
    assert replace(page, "new\n") == f"# t\n\n{BEGIN}\n\nnew\n\n{END}\n\n## After\n"
    with pytest.raises(ValueError):
        replace("# no markers\n", "new\n")


@pytest.mark.parametrize("mode", ["server", "client", "device"])
def test_list_prints_every_installed_kit(capsys: pytest.CaptureFixture[str], mode: str) -> None:
    assert main(["conform", mode, "--list"]) == 0
    printed = capsys.readouterr().out.splitlines()
    expected = [line for catalogue in catalogues() if catalogue.mode == mode
                for line in catalogue_lines(catalogue)]
    assert printed == expected


@pytest.mark.parametrize(("mode", "protocol"), [
    *(("client", protocol) for protocol in CLIENT_KITS),
    *(("device", protocol) for protocol in DEVICE_KITS)])
def test_each_client_and_device_kit_is_well_formed(mode: str, protocol: str) -> None:
    modules = CLIENT_KITS if mode == "client" else DEVICE_KITS
    try:
        found = importlib.util.find_spec(modules[protocol])
    except ModuleNotFoundError:
        found = None
    if found is None:
        pytest.skip(f"{modules[protocol]} is not written yet")
    catalogue = kit(protocol, mode)
    assert catalogue.protocol == protocol and catalogue.alive is not None
    assert (ROOT / catalogue.docs).is_file(), catalogue.docs
    assert catalogue.cases
    for case in catalogue.cases:
        assert case.id.startswith(catalogue.id_prefix) and case.id.count(".") >= 2, case.id
        assert case.title.strip() and case.section.strip(), case.id
        assert 0 < case.timeout <= 20, case.id  # a reconnection case may take 20 s
        if case.decision:
            check_decision(case.decision)
    assert catalogue in catalogues()


def test_client_and_device_kits_are_rendered_under_headings_of_their_own() -> None:
    from tests.conformance import sample_client_kit, sample_device_kit

    text = render([sample_client_kit.kit, sample_device_kit.kit])
    assert text.startswith("### WEBSMQ clients: `websmq.client`\n\n4 cases (MUST, SHOULD, "
                           "information); ")
    assert "\n### Phyllo devices: `phyllo`\n\n3 cases (MUST, information); " in text
    assert "| `websmq.client.sample.echo` | MUST | The client echoes a message | Messages |  |" \
        in text
