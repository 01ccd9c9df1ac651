"""Names a package exports but imports only when first asked for, so that importing it costs
only what is used: a client (``wireproto pub``) imports none of a protocol's server role, nor
the transports' server parts.

    __getattr__ = later(__name__, {"wireproto.protocols.ubre.server": ("UbreServer",)})

The package imports the same names under ``if TYPE_CHECKING:`` for type checkers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["later"]


def later(package: str, names_by_module: Mapping[str, Iterable[str]]) -> Callable[[str], object]:
    """The module-level ``__getattr__`` of `package`: a name of `names_by_module` imported from
    its module when first asked for, then kept in the package, so that it is asked once."""
    module_of = {name: module for module, names in names_by_module.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
