"""Calls across broker processes when the process that took them goes: killed outright (a real
child process, SIGKILL) or stopped cleanly (its goodbye), its calls in flight fail at once with
Unavailable in each protocol's words, not after call_timeout, while calls to a live process
still get their answers; and what crosses NATS for a call works with a process of the version
before acknowledgements, and survives forged acknowledgements.

Each broker is a whole service on a real nats-server; as in test_calls.py, the in-process ones
share this test's reactor."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import msgpack
import pytest_twisted
from twisted.internet import defer, reactor

from tests.cluster.test_calls import broker_on, serving, ubre_client
from tests.support import eventually, failure_of, sleep, wait_for
from tests.test_cli import Child
from wireproto.access.policy import Principal
from wireproto.cluster.calls import TAKEN_HEADER
from wireproto.codecs.nats import headers_block
from wireproto.protocols.calls import Call, CallUnavailable, RemoteCaller, pack_body
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.nydus.invocation import InvokeError
from wireproto.protocols.rpc import RequestFailed

HANGING_BROKER = Path(__file__).with_name("hanging_broker.py")
# The in-process brokers' (test_calls.broker_on): a process silent for 1 s is gone.
HEARTBEAT, DEAD_AFTER = 0.2, 1.0
# Far longer than a death takes to be seen, even on a loaded machine.
CALL_TIMEOUT = 60.0
SEEN_WITHIN = 15.0


def held() -> tuple[list[defer.Deferred], object]:
    """Handlers' answers that wait until the test gives them, and a handler that makes one."""
    waiting: list[defer.Deferred] = []

    def handler(*args: object) -> defer.Deferred:
        waiting.append(defer.Deferred())
        return waiting[-1]

    return waiting, handler


def unavailable(errors: list[BaseException]) -> list[str]:
    """What each client error says: a UBRE Fail's body, a nydus ERROR's status and message."""
    said = []
    for error in errors:
        if isinstance(error, RequestFailed):
            said.append(f"ubre {error.body}")
        elif isinstance(error, InvokeError):
            said.append(f"nydus {error.status} {error.message}")
        else:
            said.append(repr(error))
    return said


@pytest_twisted.ensureDeferred
async def test_calls_in_flight_to_a_killed_process_fail_as_unavailable_at_once(broker, nats):
    caller, at_caller = await broker_on(broker, nats, call_timeout=CALL_TIMEOUT)
    live, _ = await broker_on(broker, nats)
    answers, slow = held()
    live.server("ubre").handle("slow", slow)
    live.server("nydus").register_route("/slow", slow)
    gone: list[str] = []
    caller.cluster.roster.on_gone.append(gone.append)
    child = Child(sys.executable, str(HANGING_BROKER), nats.url, str(HEARTBEAT), str(DEAD_AFTER))
    ubre = nydus = None
    try:
        origin = (await child.line(re.compile(r"origin (\S+)"), 30)).group(1)
        await child.line(re.compile("ready"), 30)
        await serving(caller, live)
        await eventually(lambda: caller.server("nydus").remote_route("/hang"), timeout=10)
        ubre = await ubre_client(at_caller["ubre"])
        nydus = await wait_for(nydus_connect(reactor, at_caller["nydus"]))
        hanging = [ubre.request("hang", index, timeout=CALL_TIMEOUT) for index in range(6)]
        hanging += [nydus.invoke("/hang", index, timeout=CALL_TIMEOUT) for index in range(6)]
        slow_ones = [ubre.request("slow", index, timeout=CALL_TIMEOUT) for index in range(3)]
        slow_ones += [nydus.invoke("/slow", index, timeout=CALL_TIMEOUT) for index in range(3)]
        calls = caller.cluster.calls
        await eventually(lambda: calls.taken_by(origin) == 12, timeout=15)
        await eventually(lambda: calls.taken_by(live.cluster.origin_token) == 6, timeout=15)

        killed = time.monotonic()
        os.kill(child.process.pid, signal.SIGKILL)
        errors = [await failure_of(d, SEEN_WITHIN + 5) for d in hanging]
        seen = time.monotonic() - killed
        assert unavailable(errors) == ["ubre Unavailable"] * 6 + [
            "nydus 503 Service Unavailable"] * 6
        # Silent for a lease, and then judged gone at the roster's next heartbeat.
        assert seen < SEEN_WITHIN < CALL_TIMEOUT, f"failed {seen:.2f} s after the kill"
        assert gone == [origin] and calls.taken_by(origin) == 0

        # The live process's calls, taken before the other one died, are answered still.
        assert not any(d.called for d in slow_ones)
        for index, answer in enumerate(answers):
            answer.callback(f"answer {index}")
        got = await wait_for(defer.gatherResults(slow_ones), 10)
        assert sorted(got) == sorted(f"answer {index}" for index in range(6))
        assert calls.taken_by(live.cluster.origin_token) == 0
    finally:
        child.kill()
        for client in (ubre, nydus):
            if client is not None:
                await wait_for(client.close())


@pytest_twisted.ensureDeferred
async def test_calls_in_flight_to_a_process_that_stops_fail_at_its_goodbye(broker, nats):
    caller, at_caller = await broker_on(broker, nats, call_timeout=CALL_TIMEOUT)
    stopping, _ = await broker_on(broker, nats)
    waiting, hang = held()
    stopping.server("ubre").handle("hang", hang)
    stopping.server("nydus").register_route("/hang", hang)
    await serving(caller, stopping)
    origin = stopping.cluster.origin_token
    gone: list[str] = []
    caller.cluster.roster.on_gone.append(gone.append)
    ubre = await ubre_client(at_caller["ubre"])
    nydus = await wait_for(nydus_connect(reactor, at_caller["nydus"]))
    try:
        hanging = [ubre.request("hang", index, timeout=CALL_TIMEOUT) for index in range(3)]
        hanging += [nydus.invoke("/hang", index, timeout=CALL_TIMEOUT) for index in range(3)]
        # One made here, to read why it failed: its caller's own judgement at the goodbye,
        # not the refusal the stopping process sends after it.
        direct = caller.cluster.calls.call(Call(
            "ubre", "hang", "direct", RemoteCaller("ubre", "-", 0, None, Principal("x"), "")))
        await eventually(lambda: caller.cluster.calls.taken_by(origin) == 7, timeout=15)
        # A caller of the version before acknowledgements, whose call the stopping process
        # refuses as it leaves.
        subject = caller.cluster.subjects.call("ubre", "hang")
        old_caller = caller.cluster.client.request(subject, _envelope("old"), timeout=30)
        await eventually(lambda: len(waiting) == 8, timeout=15)

        await wait_for(stopping.stopService(), 10)
        errors = [await failure_of(d, SEEN_WITHIN) for d in hanging]
        assert unavailable(errors) == ["ubre Unavailable"] * 3 + [
            "nydus 503 Service Unavailable"] * 3
        why = await failure_of(direct)
        assert isinstance(why, CallUnavailable) and str(why) == "the process that took it is gone"
        headers, _ = await wait_for(old_caller, SEEN_WITHIN)
        assert b"Wp-Status: failed" in headers
        # Silent for a lease since, it is not said gone a second time.
        await sleep(DEAD_AFTER + 5 * HEARTBEAT)
        assert gone == [origin]
    finally:
        for d in waiting:
            d.callback("too late")
        await wait_for(ubre.close())
        await wait_for(nydus.close())


def _envelope(body: object) -> bytes:
    """A UBRE call's envelope, as a process of either version sends it."""
    caller = ["ubre", "127.0.0.1:1", 1, None, "someone", [], None, "elsewhere/1"]
    return msgpack.packb([caller, None, None, False, *pack_body(body)])


def _answer(body: object) -> bytes:
    return msgpack.packb([True, *pack_body(body)])


@pytest_twisted.ensureDeferred
async def test_callers_and_answerers_of_the_version_before_acknowledgements_still_work(
        broker, nats):
    caller, at_caller = await broker_on(broker, nats)
    answerer, _ = await broker_on(broker, nats)
    waiting, slow = held()
    answerer.server("ubre").handle("slow", slow)
    await serving(caller, answerer)
    client = caller.cluster.client
    subject = caller.cluster.subjects.call("ubre", "slow")
    taken = headers_block({TAKEN_HEADER: answerer.cluster.origin_token})

    # What the answering process sends, to a caller that says each version (or none).
    replies: list[tuple[str, bytes | None, bytes]] = []
    client.subscribe("test.replies.*",
                     lambda subject, reply, headers, payload:
                         replies.append((subject.rsplit(".", 1)[1], headers, payload)))
    versions = {"none": None, "1": "1", "2": "2", "3": "3", "abc": "abc", "sup": "²",
                "long": "9" * 40, "empty": ""}
    for name, version in versions.items():
        headers = None if version is None else headers_block({"Wp-Call": version})
        client.publish(subject, _envelope(name), reply=f"test.replies.{name}", headers=headers)
    await eventually(lambda: len(waiting) == len(versions), timeout=10)
    for d, name in zip(waiting, versions, strict=True):
        d.callback(name)
    await eventually(lambda: len(replies) == len(versions) + 2, timeout=10)
    assert [(name, headers) for name, headers, _ in replies if headers] == [
        ("2", taken), ("3", taken)]
    answered = {name: msgpack.unpackb(payload) for name, headers, payload in replies
                if not headers}
    assert {name: body[2].decode() for name, body in answered.items()} == {
        name: f'"{name}"' for name in versions}

    # An answering process of the version before sends its answer alone: it is the answer.
    other = answerer.cluster.client
    old = other.subscribe(
        caller.cluster.subjects.call("ubre", "old"),
        lambda subject, reply, headers, payload: reactor.callLater(
            0.2, other.publish, reply, _answer("from before")), queue="wireproto")
    await wait_for(other.flush())
    ubre = await ubre_client(at_caller["ubre"])
    try:
        assert await wait_for(ubre.request("old"), 10) == "from before"
    finally:
        other.unsubscribe(old)
        await wait_for(ubre.close())


@pytest_twisted.ensureDeferred
async def test_forged_acknowledgements_do_not_break_the_caller(broker, nats):
    caller, at_caller = await broker_on(broker, nats, call_timeout=2.0)
    forger, _ = await broker_on(broker, nats)
    client = forger.cluster.client
    forged = [
        b"NATS/1.0\r\nWp-Taken: \r\n\r\n",
        b"NATS/1.0\r\nWp-Taken: two words\r\n\r\n",
        b"NATS/1.0\r\nWp-Taken: " + b"x" * 5000 + b"\r\n\r\n",
        b"NATS/1.0\r\nWp-Taken: \xff\xfe\r\n\r\n",
        b"NATS/1.0\r\nWp-Taken\r\n\r\n",
        b"NATS/1.0 503\r\nWp-Taken: nobody\r\n\r\n",
        b"NATS/1.0\r\nWp-Status: busy\r\nWp-Taken: nobody-else\r\n\r\n",
        b"NATS/1.0\r\nWp-Taken: nobody\r\n\r\n",  # well formed, a process no one knows
        b"NATS/1.0\r\nWp-Taken: " + caller.cluster.origin_token.encode() + b"\r\n\r\n",
    ]
    replies_to: list[str] = []

    def forge(subject, reply, headers, payload, answer=True):
        replies_to.append(reply)
        for headers in forged:
            client.publish(reply, b"not an answer", headers=headers)
        if answer:
            client.publish(reply, _answer("the answer"))

    client.subscribe(forger.cluster.subjects.call("ubre", "forged"), forge, queue="wireproto")
    client.subscribe(forger.cluster.subjects.call("ubre", "unanswered"),
                     lambda *message: forge(*message, answer=False), queue="wireproto")
    await wait_for(client.flush())
    ubre = await ubre_client(at_caller["ubre"])
    try:
        assert await wait_for(ubre.request("forged"), 10) == "the answer"
        # Acknowledged, in forged words, and never answered: its call_timeout, as before.
        assert (await failure_of(ubre.request("unanswered"), 10)).body == "Timeout"
        # Acknowledgements for calls no longer waiting, and the process is as it was.
        for reply in replies_to:
            client.publish(reply, b"", headers=forged[-2])
        assert await wait_for(ubre.request("forged"), 10) == "the answer"
        calls = caller.cluster.calls
        assert calls.taken_by("nobody") == calls.taken_by(caller.cluster.origin_token) == 0
    finally:
        await wait_for(ubre.close())
