"""The kits there are: each protocol's catalogue of cases for each mode, imported when asked
for."""

from __future__ import annotations

from importlib import import_module

from wireproto.conformance.catalogue import Catalogue

__all__ = ["CLIENT_KITS", "DEVICE_KITS", "KITS", "kit"]

# Protocol name (as --protocol takes it) -> the module whose `kit` is its catalogue: servers,
# clients, and Phyllo devices.
KITS = {
    "ubre": "wireproto.conformance.ubre",
    "websmq": "wireproto.conformance.websmq",
    "subble": "wireproto.conformance.subble",
    "nydus": "wireproto.conformance.nydus",
}
CLIENT_KITS = {
    "ubre": "wireproto.conformance.ubre.client",
    "websmq": "wireproto.conformance.websmq.client",
    "subble": "wireproto.conformance.subble.client",
    "nydus": "wireproto.conformance.nydus.client",
}
DEVICE_KITS = {
    "phyllo": "wireproto.conformance.phyllo",
}
_BY_MODE = {"server": KITS, "client": CLIENT_KITS, "device": DEVICE_KITS}


def kit(protocol: str, mode: str = "server") -> Catalogue:
    """The catalogue of `protocol`'s kit for `mode` (server, client or device)."""
    kits = _BY_MODE.get(mode)
    if kits is None:
        raise ValueError(f"no conformance mode {mode!r}: one of {', '.join(_BY_MODE)}")
    if protocol not in kits:
        raise ValueError(f"no {mode} conformance kit for {protocol!r}: one of "
                         f"{', '.join(kits)}")
    catalogue = import_module(kits[protocol]).kit
    if not isinstance(catalogue, Catalogue) or catalogue.mode != mode:
        raise TypeError(f"{kits[protocol]}.kit is not a {mode} Catalogue")
    return catalogue
