"""The case model: outcomes by level, case ids, a catalogue's selection and its errors."""

from __future__ import annotations

import pytest

from wireproto.conformance.catalogue import Case, CaseResult, Catalogue, count
from wireproto.conformance.model import Level, Outcome, outcome_of


async def nothing(ctx) -> None:
    return None


def catalogue() -> Catalogue:
    kit = Catalogue("websmq", "WEBSMQ", "docs/websmq.md")
    for name in ("websmq.topic.longest", "websmq.topic.over", "websmq.topics.many",
                 "websmq.will.published"):
        kit.case(name, "t", section="s")(nothing)
    return kit


@pytest.mark.parametrize(("level", "met", "outcome"), [
    (Level.MUST, True, Outcome.PASS), (Level.MUST, False, Outcome.FAIL),
    (Level.SHOULD, True, Outcome.PASS), (Level.SHOULD, False, Outcome.NON_STRICT),
    (Level.INFORMATION, True, Outcome.INFORMATION),
    (Level.INFORMATION, False, Outcome.INFORMATION),
])
def test_the_outcome_follows_the_level(level: Level, met: bool, outcome: Outcome) -> None:
    assert outcome_of(level, met) is outcome


@pytest.mark.parametrize("bad", ["websmq", "Websmq.topic.x", "websmq.topic.", "websmq..x",
                                 "websmq.topic.long_est", "websmq.topic.<b>"])
def test_a_case_id_is_lower_case_dotted_words(bad: str) -> None:
    with pytest.raises(ValueError, match="lower-case dotted words"):
        Case(bad, "t", "s", Level.MUST, nothing)
    assert Case("websmq.engineio.polling-get", "t", "s", Level.MUST, nothing).group == \
        "websmq.engineio"


def test_select_by_id_or_prefix_in_catalogue_order() -> None:
    kit = catalogue()
    ids = [case.id for case in kit.select(["websmq.will.published", "websmq.topic"])]
    assert ids == ["websmq.topic.longest", "websmq.topic.over", "websmq.will.published"]
    # A prefix ends at a dot: websmq.topic does not take websmq.topics.many.
    assert [case.id for case in kit.select(["websmq.topic."])] == [
        "websmq.topic.longest", "websmq.topic.over"]
    assert len(kit.select(None)) == len(kit.select([])) == 4
    with pytest.raises(ValueError, match="no websmq case is or starts with 'websmq.top'"):
        kit.select(["websmq.top"])


def test_a_catalogue_refuses_two_cases_of_one_id_and_another_protocols() -> None:
    kit = catalogue()
    with pytest.raises(ValueError, match="two cases are websmq.topic.over"):
        kit.case("websmq.topic.over", "t", section="s")(nothing)
    with pytest.raises(ValueError, match="must start with websmq"):
        kit.case("ubre.topic.over", "t", section="s")(nothing)


def test_count_has_every_outcome() -> None:
    case = catalogue().cases[0]
    totals = count([CaseResult(case, Outcome.FAIL), CaseResult(case, Outcome.FAIL)])
    assert totals == {Outcome.PASS: 0, Outcome.FAIL: 2, Outcome.NON_STRICT: 0,
                      Outcome.INFORMATION: 0}
