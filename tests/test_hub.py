"""The hub's topic matching and fan-out, with host-code subscribers.

Sessions (connections) are tested over real sockets in tests/protocols/test_websmq_broker.py.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.errors import InvalidTopic
from wireproto.hub import Hub, HubMessage, Overflow
from wireproto.topics import pattern_matches, validate_pattern


def collect(hub, topic):
    got = []
    hub.subscribe_callback(topic, lambda message: got.append(message.topic))
    return got


def test_exact_subscription_gets_only_its_topic():
    hub = Hub()
    got = collect(hub, "sensors/temp")
    hub.publish(HubMessage("sensors/temp", b"1"))
    hub.publish(HubMessage("sensors/temp/x", b"2"))
    hub.publish(HubMessage("sensors", b"3"))
    assert got == ["sensors/temp"]


def test_publish_never_goes_back_to_its_sender():
    hub = Hub()
    got = []
    me = hub.subscribe_callback("t", lambda m: got.append(("me", m.payload)))
    hub.subscribe_callback("t", lambda m: got.append(("other", m.payload)))
    assert hub.publish(HubMessage("t", b"x", sender=me)) == 1
    assert got == [("other", b"x")]


def test_plus_matches_one_level_and_hash_the_rest_including_the_parent():
    hub = Hub()
    plus = collect(hub, "a/+/c")
    hash_ = collect(hub, "a/#")
    everything = collect(hub, "#")
    for topic in ["a", "a/b", "a/b/c", "a/x/c", "a/b/c/d", "b/b/c", "a//c"]:
        hub.publish(HubMessage(topic, b""))
    assert plus == ["a/b/c", "a/x/c", "a//c"]
    assert hash_ == ["a", "a/b", "a/b/c", "a/x/c", "a/b/c/d", "a//c"]
    assert len(everything) == 7


def test_a_subscriber_matched_twice_gets_one_copy():
    hub = Hub()
    got = []

    def record(message):
        got.append(message.topic)

    first = hub.subscribe_callback("a/b", record)
    hub.subscribe_pattern(first, "a/+")
    hub.subscribe_pattern(first, "a/#")
    assert hub.publish(HubMessage("a/b", b"")) == 1
    assert got == ["a/b"]


def test_cancelled_subscriptions_stop_and_the_pattern_tree_is_pruned():
    hub = Hub()
    got = []
    exact = hub.subscribe_callback("x/y", lambda m: got.append("exact"))
    pattern = hub.subscribe_callback("x/+/z/#", lambda m: got.append("pattern"))
    hub.publish(HubMessage("x/y/z/w", b""))
    assert got == ["pattern"]
    exact.cancel()
    pattern.cancel()
    hub.publish(HubMessage("x/y", b""))
    hub.publish(HubMessage("x/y/z/w", b""))
    assert got == ["pattern"]
    assert hub.topics() == []
    assert hub._patterns.root.children == {}


@pytest.mark.parametrize("pattern", ["a/#/b", "a#", "#a", "a/b+", "+a/b", "a/#x"])
def test_misplaced_wildcards_are_refused(pattern):
    with pytest.raises(InvalidTopic, match="must be a whole level"):
        validate_pattern(pattern)


def test_a_raising_callback_does_not_stop_the_fan_out():
    hub = Hub()
    got = collect(hub, "t")
    hub.subscribe_callback("t", lambda m: 1 / 0)
    got_after = collect(hub, "t")
    assert hub.publish(HubMessage("t", b"")) == 3
    assert got == got_after == ["t"]


def test_stats_count_publishes_deliveries_and_wills():
    hub = Hub()
    collect(hub, "t")
    collect(hub, "t")
    hub.publish(HubMessage("t", b""))
    hub.publish(HubMessage("t", b"", will=True))
    hub.publish(HubMessage("nobody", b""))
    assert (hub.stats.published, hub.stats.delivered, hub.stats.wills_published) == (3, 4, 1)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="queue_bytes"):
        Hub(queue_bytes=0)
    with pytest.raises(ValueError):
        Hub(overflow="drop-newest")
    assert Hub(overflow="disconnect").overflow is Overflow.DISCONNECT


level = st.sampled_from(["a", "b", ""])
topics = st.lists(level, min_size=1, max_size=4).map("/".join)
patterns = st.lists(st.sampled_from(["a", "b", "", "+"]), min_size=1, max_size=4).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"]), "#"])
)


@given(st.lists(patterns, max_size=6, unique=True), st.lists(topics, max_size=6))
def test_the_pattern_tree_agrees_with_matching_each_pattern_alone(pattern_list, topic_list):
    hub = Hub()
    seen: dict[str, list[str]] = {pattern: [] for pattern in pattern_list}
    for pattern in pattern_list:
        hub.subscribe_callback(pattern, lambda m, p=pattern: seen[p].append(m.topic))
    for topic in topic_list:
        hub.publish(HubMessage(topic, b""))
    for pattern in pattern_list:
        assert seen[pattern] == [t for t in topic_list if pattern_matches(pattern, t)]
