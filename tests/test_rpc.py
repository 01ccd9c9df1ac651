"""Request/response plumbing: pending requests by id with timeouts, handlers however written, and
errors as data. Time is a twisted.internet.task.Clock, so timeouts are exact and instant."""

from __future__ import annotations

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from wireproto.protocols.rpc import (
    ConnectionClosed,
    PendingRequests,
    RequestFailed,
    RequestTimeout,
    error_body,
    run_handler,
)


def outcome(d: defer.Deferred) -> object:
    """What a Deferred has fired with, a Failure included; fails the test if it has not fired."""
    results: list[object] = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    return results[0]


def error_of(d: defer.Deferred) -> BaseException:
    result = outcome(d)
    assert isinstance(result, Failure), f"expected a failure, got {result!r}"
    return result.value


# -- PendingRequests -------------------------------------------------------------------------------


def test_ids_count_up_from_one():
    pending = PendingRequests(Clock())
    assert [pending.next_id() for _ in range(3)] == [1, 2, 3]


def test_ids_count_per_instance():
    first, second = PendingRequests(Clock()), PendingRequests(Clock())
    first.next_id()
    assert second.next_id() == 1


def test_resolve_fires_the_request_once_and_its_timeout_never():
    clock = Clock()
    pending = PendingRequests(clock)
    d = pending.add(1, timeout=5)
    assert len(pending) == 1
    assert pending.resolve(1, {"sum": 3}) is True
    assert outcome(d) == {"sum": 3}
    assert len(pending) == 0
    assert pending.resolve(1, "again") is False
    fired = []
    d.addBoth(fired.append)
    clock.advance(5)  # the shared timer finds nothing to expire, and stops
    assert fired == [None] and clock.getDelayedCalls() == []


def test_requests_share_one_timer_and_each_times_out_at_its_own_deadline():
    clock = Clock()
    pending = PendingRequests(clock)
    late = pending.add(1, timeout=10, what="late")
    clock.advance(1)
    early = pending.add(2, timeout=2, what="early")  # due before the first: the timer moves
    answered = pending.add(3, timeout=2.5)
    same_time = pending.add(4, timeout=2)
    assert len(clock.getDelayedCalls()) == 1
    pending.resolve(3, "ok")
    clock.advance(1.999)
    assert not early.called and not same_time.called
    clock.advance(0.001)
    error = error_of(early)
    assert isinstance(error, RequestTimeout) and "'early'" in str(error)
    assert isinstance(error_of(same_time), RequestTimeout)
    assert outcome(answered) == "ok" and not late.called
    clock.advance(6.5)
    assert not late.called
    clock.advance(0.5)
    error = error_of(late)
    assert isinstance(error, RequestTimeout) and "10 s" in str(error)
    assert clock.getDelayedCalls() == [] and len(pending) == 0


def test_answered_requests_leave_no_deadlines_behind():
    # A client answered at once, for a long time, must not pile up deadlines until they fall due.
    clock = Clock()
    pending = PendingRequests(clock)
    for request_id in range(100_000):
        pending.add(request_id, timeout=30)
        pending.resolve(request_id, None)
    assert len(pending._deadlines) <= 1024 + 1
    waiting = pending.add("still", timeout=30)
    clock.advance(30)
    assert isinstance(error_of(waiting), RequestTimeout)


def test_a_reply_id_matches_by_its_text():
    # Binary formats carry ids as text: "7" answers request 7, and 8 answers request "8".
    pending = PendingRequests(Clock())
    seven = pending.add(7, timeout=None)
    eight = pending.add("8", timeout=None)
    assert pending.resolve("7", "seven")
    assert pending.reject(8, "no")
    assert outcome(seven) == "seven"
    assert error_of(eight).body == "no"


def test_reject_fails_with_request_failed_carrying_the_body_and_what():
    pending = PendingRequests(Clock())
    d = pending.add(3, timeout=None, what="add")
    assert pending.reject(3, {"name": "TypeError", "message": "bad"}) is True
    error = error_of(d)
    assert isinstance(error, RequestFailed)
    assert error.body == {"name": "TypeError", "message": "bad"}
    assert error.request == "add"
    assert pending.reject(3, "again") is False


def test_fail_fails_with_the_error_given_and_its_deadline_goes():
    clock = Clock()
    pending = PendingRequests(clock)
    d = pending.add(4, timeout=1.0)
    refused = LookupError("no one serves it")
    assert pending.fail("4", refused) is True
    assert error_of(d) is refused
    assert pending.fail(4, refused) is False
    clock.advance(2.0)  # no timeout fires for a request already failed
    assert len(pending) == 0


def test_an_unknown_id_is_neither_resolved_nor_rejected():
    pending = PendingRequests(Clock())
    d = pending.add(1, timeout=None)
    assert pending.resolve(2, "x") is False
    assert pending.reject("2", "x") is False
    assert not d.called
    assert len(pending) == 1


def test_a_duplicate_id_is_refused_even_as_text():
    pending = PendingRequests(Clock())
    pending.add(1, timeout=None)
    with pytest.raises(ValueError, match="already waiting"):
        pending.add("1", timeout=None)
    assert len(pending) == 1


def test_a_request_times_out_after_its_timeout_and_not_before():
    clock = Clock()
    pending = PendingRequests(clock)
    d = pending.add(1, timeout=2.0, what="slow")
    clock.advance(1.999)
    assert not d.called
    clock.advance(0.001)
    error = error_of(d)
    assert isinstance(error, RequestTimeout)
    assert isinstance(error, TimeoutError)
    assert "'slow'" in str(error) and "2 s" in str(error)
    assert len(pending) == 0
    # A reply that comes too late finds nothing waiting.
    assert pending.resolve(1, "late") is False


def test_no_timeout_means_no_timer():
    clock = Clock()
    pending = PendingRequests(clock)
    d = pending.add(1, timeout=None)
    assert clock.getDelayedCalls() == []
    clock.advance(10_000)
    assert not d.called


def test_fail_all_fails_every_request_and_cancels_the_timer():
    clock = Clock()
    pending = PendingRequests(clock)
    ds = [pending.add(i, timeout=5) for i in (1, 2, 3)]
    closed = ConnectionClosed("gone")
    pending.fail_all(closed)
    assert [error_of(d) for d in ds] == [closed, closed, closed]
    assert len(pending) == 0
    assert clock.getDelayedCalls() == []
    # The ids are free again, and a fresh request is unaffected.
    d = pending.add(1, timeout=None)
    pending.fail_all(closed)
    assert error_of(d) is closed


def test_cancelling_a_request_forgets_it_and_its_timeout():
    clock = Clock()
    pending = PendingRequests(clock)
    d = pending.add(1, timeout=5)
    d.cancel()
    assert isinstance(error_of(d), defer.CancelledError)
    assert len(pending) == 0
    assert pending.resolve(1, "late") is False
    clock.advance(5)
    assert clock.getDelayedCalls() == []
    # The id can be waited for again.
    pending.add(1, timeout=None)


# -- RequestFailed ---------------------------------------------------------------------------------


def test_request_failed_str_names_the_request_and_the_error():
    body = {"name": "ZeroDivisionError", "message": "division by zero"}
    assert str(RequestFailed(body, request="div")) == (
        "request 'div' failed: ZeroDivisionError: division by zero"
    )


def test_request_failed_str_with_a_message_and_no_name():
    assert str(RequestFailed({"message": "nope", "name": 3})) == "failed: nope"


def test_request_failed_str_shows_any_other_body_as_its_repr():
    assert str(RequestFailed("NotFound", request=7)) == "request 7 failed: 'NotFound'"
    assert str(RequestFailed()) == "failed: None"
    assert str(RequestFailed({"message": 1})) == "failed: {'message': 1}"
    assert RequestFailed("x").body == "x"


# -- run_handler -----------------------------------------------------------------------------------


def run(handler, *args):
    """run_handler's outcome: ("ok", value) or ("failed", exception), and its Deferred."""
    seen: list = []
    working = run_handler(
        handler, args,
        lambda value: seen.append(("ok", value)),
        lambda failure: seen.append(("failed", failure.value)),
    )
    return seen, working


def test_run_handler_answers_a_plain_value_at_once_without_a_deferred():
    seen, working = run(lambda body, peer: (body, peer), [1], "peer")
    assert seen == [("ok", ([1], "peer"))] and working is None


def test_run_handler_answers_a_raise_at_once():
    def handler(body: object) -> None:
        raise KeyError(body)

    seen, working = run(handler, "k")
    assert working is None
    assert [kind for kind, _ in seen] == ["failed"] and isinstance(seen[0][1], KeyError)


def test_run_handler_waits_for_a_deferred():
    later: defer.Deferred = defer.Deferred()
    seen, working = run(lambda body: later, "x")
    assert seen == [] and working is not None and not working.called
    later.callback("done")
    assert seen == [("ok", "done")] and working.called


def test_run_handler_waits_for_a_coroutine():
    later: defer.Deferred = defer.Deferred()

    async def handler(body: int) -> int:
        return body + await later

    seen, working = run(handler, 1)
    assert seen == [] and working is not None
    later.callback(2)
    assert seen == [("ok", 3)] and working.called


def test_run_handler_with_a_raising_coroutine():
    async def handler() -> None:
        raise RequestFailed("no")

    seen, working = run(handler)
    assert working is not None and working.called
    assert seen[0][0] == "failed" and seen[0][1].body == "no"


# -- error_body ------------------------------------------------------------------------------------


def raised(error: BaseException) -> BaseException:
    """`error` with a traceback, as a handler's exception has."""
    try:
        raise error
    except BaseException as caught:
        return caught


def test_error_body_is_the_class_name_and_message_only():
    assert error_body(raised(ZeroDivisionError("division by zero"))) == {
        "name": "ZeroDivisionError",
        "message": "division by zero",
    }


def test_error_body_with_debug_carries_the_stack():
    body = error_body(raised(ValueError("bad value")), debug=True)
    assert body["name"] == "ValueError"
    assert body["stack"].startswith("Traceback")
    assert "ValueError: bad value" in body["stack"]
    assert "raised" in body["stack"]  # the function it was raised in


class CodedError(Exception):
    def __init__(self, code: object) -> None:
        super().__init__("coded")
        self.code = code


@pytest.mark.parametrize("code", ["E_BUSY", 409])
def test_error_body_carries_a_str_or_int_code(code):
    assert error_body(CodedError(code)) == {"name": "CodedError", "message": "coded", "code": code}


@pytest.mark.parametrize("code", [True, None, 1.5, ["x"]])
def test_error_body_leaves_out_any_other_code(code):
    assert "code" not in error_body(CodedError(code))
