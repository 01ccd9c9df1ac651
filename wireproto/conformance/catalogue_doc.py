"""The catalogue of every kit as Markdown, for docs/conformance.md between its ``<!-- catalogue
begin -->`` and ``<!-- catalogue end -->`` lines: a table per kit (the server kits, then the
client kits, then the device kits) of each case's id, level, title, spec section and the docs'
section where wireproto decided what the spec leaves open.

``python -m wireproto.conformance.catalogue_doc docs/conformance.md`` writes it there; a test
checks that the page holds what `render` gives.
"""

from __future__ import annotations

import sys
from importlib import import_module
from pathlib import Path

from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.kits import CLIENT_KITS, DEVICE_KITS, KITS, kit

__all__ = ["BEGIN", "END", "catalogues", "render", "replace"]

BEGIN = "<!-- catalogue begin -->"
END = "<!-- catalogue end -->"


def catalogues() -> list[Catalogue]:
    """The catalogue of each kit this wireproto has: every server kit, in KITS' order, then
    the client kits and the device kits that are here (a kit whose module is missing is not)."""
    found = [kit(protocol) for protocol in KITS]
    for mode, kits in (("client", CLIENT_KITS), ("device", DEVICE_KITS)):
        for protocol, module in kits.items():
            try:
                import_module(module)
            except ModuleNotFoundError as error:
                if error.name is not None and module.startswith(error.name):
                    continue  # not written yet; a module it needs that is missing is an error
                raise
            found.append(kit(protocol, mode))
    return found


def _heading(catalogue: Catalogue) -> str:
    """``UBRE: `ubre` `` for a server kit, ``UBRE clients: `ubre.client` `` for a client kit,
    ``Phyllo devices: `phyllo` `` for a device kit."""
    if catalogue.mode == "client":
        return f"{catalogue.spec} clients: `{catalogue.id_prefix.rstrip('.')}`"
    if catalogue.mode == "device":
        return f"{catalogue.spec} devices: `{catalogue.protocol}`"
    return f"{catalogue.spec}: `{catalogue.protocol}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _decision(decision: str) -> str:
    """A case's decision (``docs/websmq.md#what-we-decided``) as a link from docs/."""
    if not decision:
        return ""
    target = decision.removeprefix("docs/")
    return f"[{_cell(target)}]({target})"


def render(kits: list[Catalogue] | None = None) -> str:
    """The Markdown of `kits` (every kit's by default), without the marker lines."""
    chosen = catalogues() if kits is None else kits
    if not chosen:
        return "No kit is installed.\n"
    parts = []
    for catalogue in chosen:
        levels = {case.level.value for case in catalogue.cases}
        parts.append(
            f"### {_heading(catalogue)}\n\n"
            f"{len(catalogue.cases)} cases ({', '.join(sorted(levels))}); wireproto's "
            f"decisions in [{catalogue.docs.removeprefix('docs/')}]"
            f"({catalogue.docs.removeprefix('docs/')}).\n\n"
            "| id | level | title | spec section | decided in |\n|---|---|---|---|---|\n"
            + "".join(f"| `{case.id}` | {case.level.value} | {_cell(case.title)} | "
                      f"{_cell(case.section)} | {_decision(case.decision)} |\n"
                      for case in catalogue.cases))
    return "\n".join(parts)


def replace(page: str, catalogue: str) -> str:
    """`page` with `catalogue` between its marker lines."""
    before, begin, rest = page.partition(BEGIN + "\n")
    _, end, after = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the page has no {BEGIN} ... {END} lines")
    return f"{before}{BEGIN}\n\n{catalogue}\n{END}{after}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m wireproto.conformance.catalogue_doc docs/conformance.md",
              file=sys.stderr)
        return 2
    page = Path(argv[0])
    page.write_text(replace(page.read_text(encoding="utf-8"), render()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
