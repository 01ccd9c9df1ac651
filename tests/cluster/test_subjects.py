"""The topic/subject mapping: total, reversible, never a wildcard, and patterns that match on
NATS exactly what they match in the hub."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.cluster.subjects import SubjectError, Subjects
from wireproto.topics import pattern_matches

SUBJECTS = Subjects("wp")


def nats_matches(filter_subject: str, subject: str) -> bool:
    """NATS's own matching rule: `*` one token, `>` one or more last tokens."""
    wanted, tokens = filter_subject.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or (token != "*" and token != tokens[index]):
            return False
    return len(wanted) == len(tokens)


def is_valid_subject(subject: str) -> bool:
    tokens = subject.split(".")
    return all(tokens) and not any(c.isspace() for c in subject)


@pytest.mark.parametrize(("topic", "subject"), [
    ("sensors/kitchen", "wp.topic.sensors.kitchen"),
    ("a.b", "wp.topic.a%2Eb"),
    ("*", "wp.topic.%2A"),
    (">", "wp.topic.%3E"),
    ("a b/c", "wp.topic.a%20b.c"),
    ("", "wp.topic.%"),
    ("a//b/", "wp.topic.a.%.b.%"),
    ("%", "wp.topic.%25"),
    ("+/#", "wp.topic.%2B.%23"),
    ("température", "wp.topic.temp%C3%A9rature"),
])
def test_topics_map_to_tokens_that_are_never_wildcards(topic, subject):
    assert SUBJECTS.topic(topic) == subject
    assert SUBJECTS.topic_of(subject) == topic


@given(st.text())
def test_every_topic_round_trips(topic):
    subject = SUBJECTS.topic(topic)
    assert is_valid_subject(subject)
    assert "*" not in subject and ">" not in subject
    assert SUBJECTS.topic_of(subject) == topic


@given(st.text(), st.text())
def test_different_topics_never_share_a_subject(first, second):
    if first != second:
        assert SUBJECTS.topic(first) != SUBJECTS.topic(second)


def test_lone_surrogates_round_trip():
    assert SUBJECTS.topic_of(SUBJECTS.topic("a\ud800b")) == "a\ud800b"


@pytest.mark.parametrize(("pattern", "subjects"), [
    ("#", ("wp.topic.>",)),
    ("a/#", ("wp.topic.a", "wp.topic.a.>")),
    ("+/b", ("wp.topic.*.b",)),
    ("a/+/#", ("wp.topic.a.*", "wp.topic.a.*.>")),
    ("a.b/c", ("wp.topic.a%2Eb.c",)),
])
def test_patterns(pattern, subjects):
    assert SUBJECTS.pattern(pattern) == subjects


levels = st.sampled_from(["a", "b", "", ".", "*", "+", "#", "a b", ">"])
topic_levels = st.lists(levels, min_size=1, max_size=4)


@given(topic_levels, st.lists(st.sampled_from(["a", "b", "+", "", "*"]), min_size=1, max_size=4),
       st.booleans())
def test_a_pattern_matches_on_nats_what_it_matches_in_the_hub(topic, pattern, rest):
    topic_string = "/".join(topic)
    pattern_string = "/".join([*pattern, "#"] if rest else pattern)
    hub = pattern_matches(pattern_string, topic_string)
    nats = any(nats_matches(subject, SUBJECTS.topic(topic_string))
               for subject in SUBJECTS.pattern(pattern_string))
    assert hub == nats


def test_the_whole_space_pattern_matches_every_topic():
    for topic in ("", "a", "a/b/c", "/"):
        assert any(nats_matches(s, SUBJECTS.topic(topic)) for s in SUBJECTS.pattern("#"))


@pytest.mark.parametrize("subject", [
    "other.topic.a", "wp.topic.a%2eb", "wp.topic.a%zz", "wp.topic.a..b", "wp.topic.a.b%",
    "wp.topic.%FF", "wp.topic.a*b",
])
def test_subjects_no_topic_maps_to_are_refused(subject):
    with pytest.raises(SubjectError):
        SUBJECTS.topic_of(subject)


@pytest.mark.parametrize("prefix", ["", "a..b", "a.*", "a.>", "a b"])
def test_a_prefix_must_be_a_plain_subject(prefix):
    with pytest.raises(ValueError, match="subject prefix"):
        Subjects(prefix)


def test_call_subjects_escape_the_name():
    assert SUBJECTS.call("ubre", "add") == "wp.call.ubre.add"
    assert SUBJECTS.call("nydus", "/users/*") == "wp.call.nydus.%.users.%2A"
