"""The broker's parts start in order, all or none, and stop in reverse order, each after the
next has stopped (wireproto.service.parts)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task

from wireproto.service.parts import OrderedParts, Part, StartFailed


def _parts(log: list[str], names: str, *, failing: str = "",
           slow: str = "") -> OrderedParts:
    parts = OrderedParts()
    for name in names:
        def start(name: str = name) -> None:
            if name == failing:
                raise OSError(13, "Permission denied", f"/srv/{name}")
            log.append(f"start {name}")

        def stop(name: str = name) -> defer.Deferred[None]:
            log.append(f"stopping {name}")
            delay = 0.05 if name == slow else 0.0
            return task.deferLater(reactor, delay, log.append, f"stopped {name}")

        Part(name, start, stop).setServiceParent(parts)
    return parts


@pytest_twisted.ensureDeferred
async def test_parts_start_in_order_and_each_stops_after_the_next_has_stopped():
    log: list[str] = []
    parts = _parts(log, "abc", slow="c")
    parts.startService()
    assert log == ["start a", "start b", "start c"]
    log.clear()
    await parts.stopService()
    assert log == ["stopping c", "stopped c", "stopping b", "stopped b",
                   "stopping a", "stopped a"]


def test_a_part_that_cannot_start_stops_those_started_and_says_which_and_why():
    log: list[str] = []
    parts = _parts(log, "abc", failing="b")
    with pytest.raises(StartFailed, match=r"^b: /srv/b: Permission denied$"):
        parts.startService()
    assert log == ["start a", "stopping a"]
    assert not parts.running


def test_under_twistd_parts_start_before_privileges_are_dropped_and_only_once():
    log: list[str] = []
    parts = _parts(log, "ab")
    parts.privilegedStartService()
    parts.startService()
    assert log == ["start a", "start b"]


def test_a_child_that_is_no_part_is_stopped_too_when_a_later_one_cannot_start():
    from twisted.application.service import Service

    log: list[str] = []
    parts = OrderedParts()
    Part("a", lambda: log.append("start a"), lambda: log.append("stop a")).setServiceParent(parts)
    plain = Service()
    plain.setServiceParent(parts)

    def cannot() -> None:
        raise ValueError("no")

    Part("c", cannot, lambda: None).setServiceParent(parts)
    with pytest.raises(StartFailed, match="^c: no$"):
        parts.startService()
    assert not plain.running and log == ["start a", "stop a"]
