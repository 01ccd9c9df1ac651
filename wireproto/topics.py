"""Topic patterns: MQTT-style wildcards over `/`-separated levels, and a tree that matches a
topic against many patterns at once.

`+` as a whole level matches exactly one level; `#` as the whole last level matches its parent
and everything below it (`a/#` matches `a`, `a/b` and `a/b/c`). As in MQTT, a pattern whose first
level is a wildcard does not match a topic that starts with `$` (the broker's own, such as
`$SYS/broker/uptime`): `#` is not `$SYS/#`.
"""

from __future__ import annotations

from typing import Any

from wireproto.errors import InvalidTopic

__all__ = ["validate_pattern", "is_pattern", "pattern_matches", "pattern_covers", "PatternTree"]


def validate_pattern(pattern: str) -> None:
    """Refuse a pattern whose `#` is not a whole last level, or whose `+` is not a whole level."""
    levels = pattern.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise InvalidTopic(f"pattern {pattern!r}: '#' must be a whole level, and the last")
        if "+" in level and level != "+":
            raise InvalidTopic(f"pattern {pattern!r}: '+' must be a whole level")


def is_pattern(topic: str) -> bool:
    return "+" in topic.split("/") or topic == "#" or topic.endswith("/#")


def pattern_matches(pattern: str, topic: str) -> bool:
    """Whether an MQTT-style `pattern` matches `topic`."""
    pattern_levels = pattern.split("/")
    topic_levels = topic.split("/")
    if topic[:1] == "$" and pattern_levels[0] in ("#", "+"):
        return False
    for index, level in enumerate(pattern_levels):
        if level == "#":
            return True
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(pattern_levels) == len(topic_levels)


def pattern_covers(outer: str, inner: str) -> bool:
    """Whether every topic that `inner` matches is matched by `outer` (both valid patterns; a
    topic is a pattern that matches itself)."""
    outer_levels = outer.split("/")
    inner_levels = inner.split("/")
    if inner[:1] == "$" and outer_levels[0] in ("#", "+"):
        return False  # the broker's own topics are granted only by name
    for index, level in enumerate(outer_levels):
        if level == "#":
            return True  # whatever inner has from here on, its parent included
        if index >= len(inner_levels):
            return False  # inner stops here; outer needs more levels
        inner_level = inner_levels[index]
        if inner_level == "#":
            # Inner goes on without end, and matches its parent level too; only "+/#" covers
            # that, and only as the whole pattern: every topic has at least one level.
            return index == 0 and outer_levels == ["+", "#"]
        if level != "+" and (inner_level == "+" or inner_level != level):
            return False
    return len(outer_levels) == len(inner_levels)


class PatternNode:
    __slots__ = ("children", "subscribers", "rest")

    def __init__(self) -> None:
        self.children: dict[str, PatternNode] = {}
        self.subscribers: dict[Any, None] = {}  # the pattern ends here
        self.rest: dict[Any, None] = {}  # the pattern's next level is '#'


class PatternTree:
    """Patterns by level, so matching a topic walks only the branches that can match."""

    def __init__(self) -> None:
        self.root = PatternNode()
        self.count = 0

    def add(self, pattern: str, subscriber: Any) -> None:
        node = self.root
        levels = pattern.split("/")
        for level in levels[:-1]:
            node = node.children.setdefault(level, PatternNode())
        if levels[-1] == "#":
            node.rest[subscriber] = None
        else:
            node = node.children.setdefault(levels[-1], PatternNode())
            node.subscribers[subscriber] = None
        self.count += 1

    def remove(self, pattern: str, subscriber: Any) -> None:
        path = [self.root]
        levels = pattern.split("/")
        for level in levels[:-1]:
            path.append(path[-1].children[level])
        if levels[-1] == "#":
            del path[-1].rest[subscriber]
        else:
            leaf = path[-1].children[levels[-1]]
            del leaf.subscribers[subscriber]
            path.append(leaf)
            levels.append("")
        self.count -= 1
        for depth in range(len(path) - 1, 0, -1):
            node = path[depth]
            if node.children or node.subscribers or node.rest:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def match(self, topic: str, into: dict[Any, None]) -> None:
        levels = topic.split("/")
        frontier = [self.root]
        if topic[:1] == "$":
            # Only patterns that name the first level match the broker's own topics.
            child = self.root.children.get(levels[0])
            if child is None:
                return
            frontier = [child]
            levels = levels[1:]
        for level in levels:
            following = []
            for node in frontier:
                into.update(node.rest)
                for key in (level, "+"):
                    child = node.children.get(key)
                    if child is not None:
                        following.append(child)
            if not following:
                return
            frontier = following
        for node in frontier:
            into.update(node.subscribers)
            into.update(node.rest)
