"""Topic patterns: whether one pattern covers another, checked against matching itself.

`pattern_covers(outer, inner)` must be true exactly when every topic `inner` matches is matched by
`outer`. Patterns of up to three levels over {a, b, +, #} are checked against every topic of up to
four levels over {a, b, c}: "c" is a level neither pattern names, so a "+" that a literal cannot
cover shows, and a fourth level shows where a "#" goes on.
"""

from __future__ import annotations

from itertools import product

import pytest

from wireproto.errors import InvalidTopic
from wireproto.topics import pattern_covers, pattern_matches, validate_pattern


def _patterns(levels: int) -> list[str]:
    found = []
    for depth in range(1, levels + 1):
        for parts in product(["a", "b", "+", "#"], repeat=depth):
            pattern = "/".join(parts)
            try:
                validate_pattern(pattern)
            except InvalidTopic:
                continue
            found.append(pattern)
    return found


PATTERNS = _patterns(3)
TOPICS = ["/".join(parts) for depth in range(1, 5) for parts in product("abc", repeat=depth)]


def test_covers_exactly_when_every_topic_of_the_inner_pattern_matches_the_outer():
    for outer in PATTERNS:
        for inner in PATTERNS:
            expected = all(pattern_matches(outer, topic) for topic in TOPICS
                           if pattern_matches(inner, topic))
            assert pattern_covers(outer, inner) == expected, (outer, inner)


@pytest.mark.parametrize(("outer", "inner", "covers"), [
    ("a/#", "a", True),  # '#' matches its parent level too
    ("a/+/#", "a/#", False),  # ... which 'a/+/#' does not
    ("a/+", "a/#", False),
    ("+/b", "a/b", True),
    ("a/b", "a/+", False),
    ("#", "#", True),
    ("+/#", "#", True),  # every topic has at least one level
    ("+/+/#", "#", False),
    ("sensors/%u/#", "sensors/%u/temp", True),  # placeholders are plain levels here
])
def test_covers_examples(outer, inner, covers):
    assert pattern_covers(outer, inner) is covers


@pytest.mark.parametrize(("pattern", "topic", "matches"), [
    ("#", "$SYS/broker/uptime", False),  # as in MQTT: the broker's own topics are apart
    ("+/broker/uptime", "$SYS/broker/uptime", False),
    ("$SYS/#", "$SYS/broker/uptime", True),
    ("$SYS/+/uptime", "$SYS/broker/uptime", True),
    ("#", "a/$SYS", True),  # only a first level that starts with '$'
    ("+", "$x", False),
    ("$x", "$x", True),
])
def test_a_wildcard_first_level_does_not_match_a_dollar_topic(pattern, topic, matches):
    from wireproto.topics import PatternTree

    assert pattern_matches(pattern, topic) is matches
    tree = PatternTree()
    tree.add(pattern, "subscriber")
    found: dict = {}
    tree.match(topic, found)
    assert bool(found) is matches
    assert pattern_covers(pattern, topic) is matches
