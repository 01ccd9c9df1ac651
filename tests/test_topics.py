"""Topic patterns: whether one pattern covers another, checked against matching itself, and the
tree of topics that finds a pattern's topics.

`pattern_covers(outer, inner)` must be true exactly when every topic `inner` matches is matched by
`outer`. Patterns of up to three levels over {a, b, +, #} are checked against every topic of up to
four levels over {a, b, c}: "c" is a level neither pattern names, so a "+" that a literal cannot
cover shows, and a fourth level shows where a "#" goes on. A `TopicTree` must find exactly the
topics `pattern_matches` does.
"""

from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.errors import InvalidTopic
from wireproto.topics import TopicTree, pattern_covers, pattern_matches, validate_pattern


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
    topics = TopicTree()
    topics.add(topic)
    assert topics.match(pattern)[0] == ([topic] if matches else [])


# Levels a topic may have, '$' ones, empty ones and the wildcards' own characters included, so
# the tree's walk is checked where it could differ from pattern_matches.
_LEVELS = st.sampled_from(["a", "b", "ab", "", "$a", "$", "+", "#", "é"])
_TOPICS = st.lists(_LEVELS, min_size=1, max_size=5).map("/".join)
_PATTERNS = st.lists(st.sampled_from(["a", "b", "", "$a", "+"]), min_size=0, max_size=5).flatmap(
    lambda levels: st.sampled_from([levels + ["#"], levels] if levels else [["#"]])).map("/".join)


@given(st.lists(st.tuples(st.booleans(), _TOPICS), max_size=40), st.lists(_PATTERNS, max_size=8))
def test_a_topic_tree_finds_what_pattern_matches_finds(changes, patterns):
    tree = TopicTree()
    kept: set[str] = set()
    for add, topic in changes:
        if add:
            tree.add(topic)
            kept.add(topic)
        else:
            tree.discard(topic)
            kept.discard(topic)
        assert len(tree) == len(kept)
    for pattern in patterns:
        validate_pattern(pattern)
        found, examined = tree.match(pattern)
        assert sorted(found) == sorted(topic for topic in kept if pattern_matches(pattern, topic))
        assert len(found) <= examined <= 2 * len(kept) + 1
    for topic in list(kept):
        tree.discard(topic)
    assert len(tree) == 0 and not tree.root.children  # nothing left behind


def test_a_topic_tree_walks_only_the_branches_a_pattern_can_match():
    tree = TopicTree()
    for number in range(1000):
        tree.add(f"sensors/{number}/t")
    assert tree.match("nothing/#") == ([], 0)
    assert tree.match("sensors/7/+")[0] == ["sensors/7/t"]
    assert tree.match("sensors/7/+")[1] <= 3
    assert tree.match("sensors/+/t")[1] <= 1001


@given(st.lists(st.tuples(_PATTERNS, st.integers(0, 3)), max_size=12),
       st.lists(_TOPICS, min_size=1, max_size=6))
def test_a_pattern_trees_groups_hold_whom_match_finds_and_its_holders_each_pattern(
        held, topics):
    from wireproto.topics import PatternTree

    tree: PatternTree[int] = PatternTree()
    for pattern, holder in held:
        validate_pattern(pattern)
        tree.add(pattern, holder)
    for topic in topics:
        found: dict = {}
        tree.match(topic, found)
        groups = tree.groups(topic)
        assert set().union(*groups) == set(found) == {
            holder for pattern, holder in held if pattern_matches(pattern, topic)}
        assert all(groups)  # no empty ones to count
    for pattern, _ in held:
        assert set(tree.holders(pattern)) == {h for p, h in held if p == pattern}
    assert tree.holders("nobody/+") == {} and tree.holders("nobody/#") == {}
