"""Topic patterns: MQTT-style wildcards over `/`-separated levels, a tree that matches a topic
against many patterns at once (`PatternTree`), and one that finds the topics a pattern matches
among many (`TopicTree`).

`+` as a whole level matches exactly one level; `#` as the whole last level matches its parent
and everything below it (`a/#` matches `a`, `a/b` and `a/b/c`). As in MQTT, a pattern whose first
level is a wildcard does not match a topic that starts with `$` (the broker's own, such as
`$SYS/broker/uptime`): `#` is not `$SYS/#`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from wireproto.errors import InvalidTopic

__all__ = ["validate_pattern", "is_pattern", "refuse_pattern", "hub_topic_error", "mount_error",
           "pattern_matches",
           "pattern_covers", "PatternTree", "TopicTree"]


def validate_pattern(pattern: str) -> None:
    """Refuse a pattern whose `#` is not a whole last level, or whose `+` is not a whole level.
    Whether a string is a pattern at all is `is_pattern`'s to say: `tt/a+b` and `tt/#/x` are
    topics, not bad patterns."""
    levels = pattern.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise InvalidTopic(f"pattern {pattern!r}: '#' must be a whole level, and the last")
        if "+" in level and level != "+":
            raise InvalidTopic(f"pattern {pattern!r}: '+' must be a whole level")


def is_pattern(topic: str) -> bool:
    """Whether `topic` has `+` as a whole level or `#` as the whole last one: the hub's one
    definition of a pattern (a subscription matches by it; nothing is published on it)."""
    return "+" in topic.split("/") or topic == "#" or topic.endswith("/#")


def refuse_pattern(topic: str) -> None:
    """InvalidTopic for a publish (or a will) on a pattern: a subscriber matches `tt/+` and
    `tt/#`, a message is never published on one. A `+` or `#` inside a level is no wildcard
    (`tt/a+b` is a topic)."""
    if is_pattern(topic):
        raise InvalidTopic(f"{topic[:100]!r} is a pattern: publish on a topic, not a pattern")


def hub_topic_error(topic: str) -> str | None:
    """Why `topic` cannot be one a link publishes on in the hub (a Phyllo device's, a link's
    prefix), or None: it is empty, or holds ``+``, ``#`` or NUL."""
    if not topic:
        return "it is empty"
    for char in ("+", "#", "\x00"):
        if char in topic:
            return f"it holds {char!r}"
    return None


def mount_error(prefix: str) -> str | None:
    """Why `prefix` cannot be where a connection's topics are mounted (``PREFIX/topic``), or
    None: a `hub_topic_error`, or one of the broker's own (``$``), or ending with ``/``."""
    problem = hub_topic_error(prefix)
    if problem is not None:
        return problem
    if prefix.startswith("$"):
        return "topics starting with '$' are the broker's own"
    if prefix.endswith("/"):
        return "it ends with '/'"
    return None


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


# Whoever holds a pattern: the tree only keeps them, as dict keys.
Subscriber = TypeVar("Subscriber", bound=Hashable)


class PatternNode(Generic[Subscriber]):
    __slots__ = ("children", "subscribers", "rest")

    def __init__(self) -> None:
        self.children: dict[str, PatternNode[Subscriber]] = {}
        self.subscribers: dict[Subscriber, None] = {}  # the pattern ends here
        self.rest: dict[Subscriber, None] = {}  # the pattern's next level is '#'


class PatternTree(Generic[Subscriber]):
    """Patterns by level, so matching a topic walks only the branches that can match."""

    def __init__(self) -> None:
        self.root: PatternNode[Subscriber] = PatternNode()
        self.count = 0

    def add(self, pattern: str, subscriber: Subscriber) -> None:
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

    def remove(self, pattern: str, subscriber: Subscriber) -> None:
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

    def match(self, topic: str, into: dict[Subscriber, None]) -> None:
        """Add to `into` everyone whose pattern matches `topic` (the publish path's walk;
        `groups` walks alike)."""
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

    def groups(self, topic: str) -> list[dict[Subscriber, None]]:
        """The holders of the patterns that match `topic`, as the tree keeps them: one dict per
        matching pattern's end (a holder of several matching patterns is in several), so they
        can be counted without being gathered."""
        found: list[dict[Subscriber, None]] = []
        levels = topic.split("/")
        frontier = [self.root]
        if topic[:1] == "$":
            child = self.root.children.get(levels[0])
            if child is None:
                return found
            frontier = [child]
            levels = levels[1:]
        for level in levels:
            following = []
            for node in frontier:
                if node.rest:
                    found.append(node.rest)
                for key in (level, "+"):
                    child = node.children.get(key)
                    if child is not None:
                        following.append(child)
            if not following:
                return found
            frontier = following
        for node in frontier:
            if node.subscribers:
                found.append(node.subscribers)
            if node.rest:
                found.append(node.rest)
        return found

    def holders(self, pattern: str) -> dict[Subscriber, None]:
        """Who holds `pattern` itself (not the patterns that match it); do not change it."""
        node: PatternNode[Subscriber] | None = self.root
        levels = pattern.split("/")
        for level in levels[:-1]:
            node = node.children.get(level) if node is not None else None
        if node is None:
            return {}
        if levels[-1] == "#":
            return node.rest
        leaf = node.children.get(levels[-1])
        return {} if leaf is None else leaf.subscribers


class TopicNode:
    __slots__ = ("edge", "children", "topic")

    def __init__(self, edge: str, topic: str | None) -> None:
        # The levels from the parent down to this node, joined by '/': one or more.
        self.edge = edge
        # By the first level of their edge.
        self.children: dict[str, TopicNode] = {}
        self.topic = topic  # the topic that ends here, if one does


class TopicTree:
    """Topics by level, so the topics a pattern matches are found by walking only the branches
    the pattern can match, with the same answers as `pattern_matches`.

    Levels that no two topics share are kept as one node (the tree is path-compressed), so it
    holds at most two nodes per topic, however many levels a topic has.
    """

    def __init__(self) -> None:
        self.root = TopicNode("", None)  # no levels of its own; it is no topic's
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, topic: str) -> None:
        levels = topic.split("/")
        node, index = self.root, 0
        while index < len(levels):
            child = node.children.get(levels[index])
            if child is None:
                node.children[levels[index]] = TopicNode("/".join(levels[index:]), topic)
                self.count += 1
                return
            edge = child.edge.split("/")
            shared, most = 1, min(len(edge), len(levels) - index)
            while shared < most and edge[shared] == levels[index + shared]:
                shared += 1
            if shared < len(edge):  # the topic leaves the edge part way: split it there
                middle = TopicNode("/".join(edge[:shared]), None)
                child.edge = "/".join(edge[shared:])
                middle.children[edge[shared]] = child
                node.children[levels[index]] = child = middle
            node, index = child, index + shared
        if node.topic is None:
            node.topic = topic
            self.count += 1

    def discard(self, topic: str) -> None:
        levels = topic.split("/")
        node, index = self.root, 0
        parents: list[TopicNode] = []
        while index < len(levels):
            child = node.children.get(levels[index])
            if child is None:
                return
            edge = child.edge.split("/")
            if levels[index : index + len(edge)] != edge:
                return
            parents.append(node)
            node, index = child, index + len(edge)
        if node.topic != topic:
            return
        node.topic = None
        self.count -= 1
        if not node.children:
            parent = parents.pop()
            del parent.children[node.edge.split("/", 1)[0]]
            node = parent
        # A node that ends no topic and leads to one child only joins that child.
        if node is not self.root and node.topic is None and len(node.children) == 1:
            (only,) = node.children.values()
            only.edge = f"{node.edge}/{only.edge}"
            parents[-1].children[node.edge.split("/", 1)[0]] = only

    def match(self, pattern: str) -> tuple[list[str], int]:
        """The topics `pattern` (a valid pattern) matches, in no particular order, and how many
        nodes the walk examined (at least one per topic found)."""
        levels = pattern.split("/")
        last = len(levels)
        found: list[str] = []
        examined = 0
        # A wildcard first level does not match a topic whose first level starts with '$'.
        wildcard_root = levels[0] in ("+", "#")
        if levels[0] == "#":
            for key, child in self.root.children.items():
                if key[:1] != "$":
                    examined += self._all_below(child, found)
            return found, examined
        walking = [(self.root, 0)]
        while walking:
            node, index = walking.pop()
            if index == last:
                if node.topic is not None:
                    found.append(node.topic)
                continue
            level = levels[index]
            if level == "#":  # the parent, this node, and everything below it
                examined += self._all_below(node, found) - 1  # this node was counted
                continue
            if level == "+":
                if node is self.root and wildcard_root:
                    children = [child for key, child in node.children.items() if key[:1] != "$"]
                else:
                    children = list(node.children.values())
            else:
                named = node.children.get(level)
                if named is None:
                    continue
                children = [named]
            for child in children:
                examined += 1
                edge = child.edge
                if "/" not in edge:  # one level, matched already
                    walking.append((child, index + 1))
                    continue
                at = index + 1
                for edge_level in edge.split("/")[1:]:
                    if at == last:
                        break  # the topics here have more levels than the pattern
                    wanted = levels[at]
                    if wanted == "#":  # mid-edge: every topic from here on has its levels
                        examined += self._all_below(child, found) - 1
                        break
                    if wanted != "+" and wanted != edge_level:
                        break
                    at += 1
                else:
                    walking.append((child, at))
        return found, examined

    @staticmethod
    def _all_below(node: TopicNode, found: list[str]) -> int:
        """Add the topics of `node` and below to `found`; the nodes examined."""
        examined = 0
        below = [node]
        while below:
            node = below.pop()
            examined += 1
            if node.topic is not None:
                found.append(node.topic)
            below.extend(node.children.values())
        return examined
