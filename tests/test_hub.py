"""The hub's topic matching and fan-out, with host-code subscribers.

Sessions (connections) are tested over real sockets in tests/protocols/test_websmq_broker.py.
"""

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from tests.support import eventually, sleep, wait_for
from tests.transports.conftest import Recorder
from wireproto.errors import InvalidTopic
from wireproto.hub import Hub, HubMessage, Overflow, Session
from wireproto.topics import pattern_matches, validate_pattern
from wireproto.transports import MessageProtocol
from wireproto.transports.connect import connect
from wireproto.transports.stream import StreamOptions, stream_server_factory

# Every test on both fast paths: the fan-out loop is theirs (speedups.deliver_frames).
pytestmark = pytest.mark.usefixtures("fast_path")


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


# -- topic observers -------------------------------------------------------------------------------


class TopicEvents:
    """A topic observer recording what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def topic_started(self, topic: str) -> None:
        self.events.append(("started", topic))

    def topic_ended(self, topic: str) -> None:
        self.events.append(("ended", topic))


def observed_hub() -> tuple[Hub, TopicEvents]:
    hub = Hub()
    observer = TopicEvents()
    hub.add_topic_observer(observer)
    return hub, observer


def test_a_topic_starts_with_its_first_subscriber_of_any_kind_and_only_then():
    hub, observer = observed_hub()
    local = hub.subscribe_callback("t", lambda m: None)
    assert observer.events == [("started", "t")]
    hub.subscribe_callback("t", lambda m: None)
    connection = object()  # a subscriber the way a protocol holds one
    assert hub.subscribe(connection, "t") is True
    assert hub.subscribe(connection, "t") is False
    assert observer.events == [("started", "t")]
    local.cancel()
    assert hub.subscribe(connection, "u") is True
    assert observer.events == [("started", "t"), ("started", "u")]


def test_a_topic_ends_when_its_last_subscriber_goes():
    hub, observer = observed_hub()
    first = hub.subscribe_callback("t", lambda m: None)
    connection = object()
    hub.subscribe(connection, "t")
    first.cancel()
    assert observer.events == [("started", "t")]
    assert hub.unsubscribe(connection, "t") is True
    assert observer.events == [("started", "t"), ("ended", "t")]
    assert hub.unsubscribe(connection, "t") is False
    assert observer.events == [("started", "t"), ("ended", "t")]
    hub.subscribe(connection, "t")
    assert observer.events[-1] == ("started", "t")


def test_patterns_start_and_end_no_topic():
    hub, observer = observed_hub()
    pattern = hub.subscribe_callback("a/#", lambda m: None)
    hub.publish(HubMessage("a/b", b""))
    pattern.cancel()
    assert observer.events == []


def test_a_raising_observer_is_logged_and_breaks_nothing():
    from twisted.logger import capturedLogs

    class Broken:
        def topic_started(self, topic: str) -> None:
            raise RuntimeError("observer bug")

        def topic_ended(self, topic: str) -> None:
            raise RuntimeError("observer bug")

    hub = Hub()
    hub.add_topic_observer(Broken())
    observer = TopicEvents()
    hub.add_topic_observer(observer)
    got = []
    with capturedLogs() as logged:
        subscription = hub.subscribe_callback("t", got.append)
        hub.publish(HubMessage("t", b"x"))
        subscription.cancel()
    assert [m.payload for m in got] == [b"x"]
    assert observer.events == [("started", "t"), ("ended", "t")]
    failures = [event["log_failure"].value for event in logged if "log_failure" in event]
    assert [str(error) for error in failures] == ["observer bug", "observer bug"]
    assert hub.topics() == []


def test_a_removed_observer_is_told_nothing_more():
    hub, observer = observed_hub()
    hub.subscribe_callback("t", lambda m: None)
    hub.remove_topic_observer(observer)
    hub.subscribe_callback("u", lambda m: None)
    assert observer.events == [("started", "t")]
    with pytest.raises(ValueError):
        hub.remove_topic_observer(observer)


def test_an_observer_may_remove_itself_while_told():
    hub = Hub()

    class Once(TopicEvents):
        def topic_started(self, topic: str) -> None:
            super().topic_started(topic)
            hub.remove_topic_observer(self)

    once, always = Once(), TopicEvents()
    hub.add_topic_observer(once)
    hub.add_topic_observer(always)
    hub.subscribe_callback("t", lambda m: None)
    hub.subscribe_callback("u", lambda m: None)
    assert once.events == [("started", "t")]
    assert always.events == [("started", "t"), ("started", "u")]


# -- sessions on a real connection: closing, send, set_wire_format ---------------------------------


def encoder(prefix: bytes, calls: list[bytes]):
    """A wire format that prefixes payloads, counting how often it encodes."""

    def encode(message: HubMessage) -> tuple[bytes, bool]:
        calls.append(prefix)
        return prefix + message.payload, True

    return encode


class HubConnection(MessageProtocol):
    """The server side of a connection: a session on the hub, subscribed to what the peer
    sends, in the `plain` wire format."""

    def __init__(self, hub: Hub, opened: list, encodes: list[bytes]) -> None:
        self.hub = hub
        self.opened = opened
        self.encodes = encodes

    def connectionMade(self) -> None:
        self.session = self.hub.attach(
            self.transport, protocol="test", wire_format="plain",
            encode=encoder(b"plain:", self.encodes),
        )
        self.opened.append(self)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.session.subscribe(data.decode())

    def connectionLost(self, reason) -> None:
        super().connectionLost(reason)
        self.session.close()


class Sessions:
    """A hub behind a length32 listener on 127.0.0.1, and Recorder clients connected to it."""

    def __init__(self) -> None:
        self.hub = Hub()
        self.opened: list[HubConnection] = []
        self.encodes: list[bytes] = []
        self.clients: list[Recorder] = []

    async def start(self) -> "Sessions":
        factory = stream_server_factory(
            lambda: HubConnection(self.hub, self.opened, self.encodes), StreamOptions()
        )
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        self.listening = await wait_for(endpoint.listen(factory))
        return self

    async def stop(self) -> None:
        for client in self.clients:
            if client.connected:
                client.transport.abortConnection()
            await wait_for(client.lost)
        await eventually(lambda: all(c.session.closed for c in self.opened))
        await wait_for(defer.maybeDeferred(self.listening.stopListening))

    async def connect(self, *topics: str) -> tuple[Recorder, Session]:
        """A client, subscribed to `topics`, and its session on the hub."""
        address = f"tcp:host=127.0.0.1:port={self.listening.getHost().port}"
        client = await wait_for(connect(reactor, address, Recorder))
        self.clients.append(client)
        await eventually(lambda: len(self.opened) == len(self.clients))
        session = self.opened[-1].session
        for topic in topics:
            client.transport.sendMessage(topic.encode())
        await eventually(lambda: session.topics == set(topics))
        return client, session


@pytest_twisted.async_yield_fixture
async def sessions():
    running = await Sessions().start()
    try:
        yield running
    finally:
        await running.stop()


@pytest_twisted.ensureDeferred
async def test_a_closing_session_ends_its_topics(sessions):
    observer = TopicEvents()
    sessions.hub.add_topic_observer(observer)
    client, session = await sessions.connect("a", "b")
    other, _ = await sessions.connect("b")
    assert observer.events == [("started", "a"), ("started", "b")]
    client.transport.loseConnection()
    await eventually(lambda: session.closed)
    assert sorted(observer.events[2:]) == [("ended", "a")]
    other.transport.loseConnection()
    await eventually(lambda: len(observer.events) == 4)
    assert observer.events[3] == ("ended", "b")
    assert sessions.hub.topics() == []


@pytest_twisted.ensureDeferred
async def test_session_send_goes_through_the_queue_behind_what_waits(sessions):
    client, session = await sessions.connect("t")
    session.pauseProducing()  # as Twisted does when the socket's buffer is full
    sessions.hub.publish(HubMessage("t", b"1"))
    session.send(b"own", True)
    sessions.hub.publish(HubMessage("t", b"2"))
    await sleep(0.05)
    assert client.messages == []
    session.resumeProducing()
    assert [data for data, _ in await client.received(3)] == [b"plain:1", b"own", b"plain:2"]
    assert session.sent == 3


@pytest_twisted.ensureDeferred
async def test_session_send_after_close_sends_nothing(sessions):
    client, session = await sessions.connect()
    session.send(b"before", True)
    session.close()
    session.send(b"after", True)
    session.transport.sendMessage(b"marker")  # the connection itself is still up
    assert [data for data, _ in await client.received(2)] == [b"before", b"marker"]


@pytest_twisted.ensureDeferred
async def test_set_wire_format_changes_what_a_session_receives(sessions):
    first, first_session = await sessions.connect("t")
    second, second_session = await sessions.connect("t")
    sessions.hub.publish(HubMessage("t", b"1"))
    # One encoding per wire format, however many sessions share it.
    assert sessions.encodes == [b"plain:"]
    tagged: list[bytes] = []
    second_session.set_wire_format("tagged", encoder(b"tagged:", tagged))
    sessions.hub.publish(HubMessage("t", b"2"))
    assert [data for data, _ in await first.received(2)] == [b"plain:1", b"plain:2"]
    assert [data for data, _ in await second.received(2)] == [b"plain:1", b"tagged:2"]
    assert sessions.encodes == [b"plain:", b"plain:"]
    assert tagged == [b"tagged:"]
    # An encoding the publisher already has in the new format is used as it is.
    sessions.hub.publish(HubMessage("t", b"3"), {"tagged": (b"given:3", True)})
    assert (await second.received(3))[2] == (b"given:3", True)
    assert tagged == [b"tagged:"]


@pytest_twisted.ensureDeferred
async def test_a_topic_counts_the_sessions_its_delivery_reaches(sessions):
    """`sessions_reached` and `pattern_sessions` agree with the publish path's matching over
    many subscriptions and unsubscriptions, taps and bridges (host code) left out."""
    import random

    made = [(await sessions.connect())[1] for _ in range(5)]
    hub = sessions.hub
    for held in ("#", "a/+", "a/b", "$SYS/#"):
        hub.subscribe_callback(held, lambda message: None)
    chosen = random.Random(37)
    names = ["a", "a/b", "a/c", "b", "$SYS/x", "#", "a/#", "a/+", "+/b", "+", "$SYS/#", "+/+/c"]
    topics = ["a", "a/b", "a/c", "a/b/c", "b", "b/b", "x/y/c", "$SYS/x", "$SYS", "c"]
    for _ in range(300):
        session, name = chosen.choice(made), chosen.choice(names)
        pattern = "+" in name.split("/") or name.endswith("#")
        if pattern and name in session.patterns:
            session.unsubscribe_pattern(name)
        elif pattern:
            session.subscribe_pattern(name)
        elif name in session.topics:
            session.unsubscribe(name)
        else:
            session.subscribe(name)
        reached = hub.sessions_reached(topics)
        for topic in topics:
            delivered = sum(isinstance(each, Session) for each in hub.subscribers(topic))
            assert reached[topic] == delivered, topic
        for held in hub.patterns():
            assert hub.pattern_sessions(held) == sum(held in s.patterns for s in made), held
