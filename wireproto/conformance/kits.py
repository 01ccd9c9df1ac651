"""The kits there are: each protocol's catalogue of cases, imported when asked for."""

from __future__ import annotations

from importlib import import_module

from wireproto.conformance.catalogue import Catalogue

__all__ = ["KITS", "kit"]

# Protocol name (as --protocol takes it) -> the module whose `kit` is its catalogue.
KITS = {
    "ubre": "wireproto.conformance.ubre",
    "websmq": "wireproto.conformance.websmq",
    "subble": "wireproto.conformance.subble",
    "nydus": "wireproto.conformance.nydus",
}


def kit(protocol: str) -> Catalogue:
    """The catalogue of `protocol`'s kit."""
    if protocol not in KITS:
        raise ValueError(f"no conformance kit for {protocol!r}: one of {', '.join(KITS)}")
    catalogue = import_module(KITS[protocol]).kit
    if not isinstance(catalogue, Catalogue):
        raise TypeError(f"{KITS[protocol]}.kit is not a Catalogue")
    return catalogue
