"""The nydus routes other broker processes serve, as this one matches them: an INVOKE that no
route here takes goes to the process whose route matches its path (docs/cluster.md, "Calls").
The processes announce their routes by their keys (`route_key`); the table made from them is
kept until what they announce changes."""

from __future__ import annotations

import re

from wireproto.hub import Hub
from wireproto.protocols.nydus.routes import RouteTable, route_of_key

__all__ = ["RoutesElsewhere"]


class RoutesElsewhere:
    """The routes the other processes of `hub`'s federation serve."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._table = RouteTable()
        self._version = -1

    def _current(self) -> RouteTable:
        version, keys = self.hub.federation.served_elsewhere("nydus")
        if version != self._version:
            table = RouteTable()
            for key in keys:
                try:
                    table.add(route_of_key(key), key)
                except (ValueError, TypeError, re.error):
                    continue  # a pattern this process cannot read: not reachable from here
            self._table, self._version = table, version
        return self._table

    def match(self, path: str) -> str | None:
        """The key of the route that matches `path`, or None."""
        match = self._current().match(path)
        return None if match is None else match.action

    def patterns(self) -> list[str]:
        """Their patterns (a compiled pattern's source), those this process can match."""
        return [route.pattern for route in self._current().routes]
