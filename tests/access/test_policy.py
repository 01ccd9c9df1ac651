"""The access policy, sans-IO: rules, placeholders, wildcard subscriptions, narrowing, caching."""

from __future__ import annotations

import pytest

from wireproto.access import ANONYMOUS, AccessRule, Action, Policy, Principal
from wireproto.errors import InvalidTopic

PUBLISH, SUBSCRIBE, CALL, SERVE = Action.PUBLISH, Action.SUBSCRIBE, Action.CALL, Action.SERVE
ALICE = Principal("alice", roles=["ops"], client_id="phone-1")


def test_an_open_policy_allows_everything_to_everyone():
    grants = Policy.open().grants(ANONYMOUS)
    assert all(grants.allows(action, "any/topic") for action in Action)
    assert grants.allows(SUBSCRIBE, "#")


def test_with_rules_what_no_rule_allows_is_denied():
    grants = Policy([]).grants(ALICE)
    assert not any(grants.allows(action, "a") for action in Action)


def test_rules_apply_to_their_principal_their_role_or_everyone():
    policy = Policy([
        AccessRule(publish=["public/#"]),
        AccessRule(principal="alice", publish=["alice/#"]),
        AccessRule(role="ops", publish=["ops/#"]),
    ])
    alice, bob, anonymous = (policy.grants(p) for p in (ALICE, Principal("bob"), ANONYMOUS))
    assert [g.allows(PUBLISH, "public/news") for g in (alice, bob, anonymous)] == [True] * 3
    assert [g.allows(PUBLISH, "alice/x") for g in (alice, bob, anonymous)] == [True, False, False]
    assert [g.allows(PUBLISH, "ops/deploy") for g in (alice, bob, anonymous)] == [
        True, False, False]


def test_each_action_is_granted_on_its_own():
    grants = Policy([AccessRule(publish=["a"], call=["add"], serve=["sum"])]).grants(ALICE)
    assert grants.allows(PUBLISH, "a") and not grants.allows(SUBSCRIBE, "a")
    assert grants.allows(CALL, "add") and not grants.allows(SERVE, "add")
    assert grants.allows(SERVE, "sum") and not grants.allows(CALL, "sum")


def test_placeholders_stand_for_the_principal_and_its_client_id():
    policy = Policy([AccessRule(subscribe=["users/%u/#", "devices/%c", "100%%/%u"])])
    grants = policy.grants(ALICE)
    assert grants.allows(SUBSCRIBE, "users/alice/inbox")
    assert not grants.allows(SUBSCRIBE, "users/bob/inbox")
    assert grants.allows(SUBSCRIBE, "devices/phone-1")
    assert grants.allows(SUBSCRIBE, "100%/alice")


@pytest.mark.parametrize("name", ["a/b", "+", "#", "x+y", ""])
def test_a_name_can_never_widen_a_rule(name):
    grants = Policy([AccessRule(subscribe=["users/%u"])]).grants(Principal(name))
    assert not grants.allows(SUBSCRIBE, f"users/{name}")
    assert not grants.allows(SUBSCRIBE, "users/+")
    assert grants.patterns[SUBSCRIBE] == ()


def test_a_placeholder_without_a_value_grants_nothing():
    policy = Policy([AccessRule(publish=["users/%u", "devices/%c"])])
    assert policy.grants(ANONYMOUS).patterns[PUBLISH] == ()
    assert policy.grants(Principal("bob")).patterns[PUBLISH] == ("users/bob",)


@pytest.mark.parametrize("value", ["$SYS", "$share", "$"])
def test_a_placeholder_never_stands_for_a_value_beginning_with_a_dollar(value):
    # A client that chose the client ID (or a login named) "$SYS" would get the broker's own
    # topics from a rule meant for its own.
    policy = Policy([AccessRule(subscribe=["%c/#", "%u/#"], publish=["%c/#", "%u/#"])])
    for principal in (Principal(value, client_id="phone"), Principal("bob", client_id=value)):
        grants = policy.grants(principal)
        assert not grants.allows(SUBSCRIBE, f"{value}/broker/version")
        assert not grants.allows(PUBLISH, f"{value}/broker/version")
    assert policy.grants(Principal("bob", client_id=value)).patterns[PUBLISH] == ("bob/#",)


def test_a_client_id_grants_nothing_to_an_anonymous_connection():
    # Anyone may claim any client ID anonymously: %c could isolate no one.
    policy = Policy([AccessRule(subscribe=["devices/%c/#"], publish=["devices/%c/#"])])
    anonymous = policy.grants(Principal(client_id="dev1"))
    assert anonymous.patterns[SUBSCRIBE] == anonymous.patterns[PUBLISH] == ()
    assert not anonymous.allows(SUBSCRIBE, "devices/dev1/cmd")
    named = policy.grants(Principal("alice", client_id="dev1"))
    assert named.allows(SUBSCRIBE, "devices/dev1/cmd")


def test_a_wildcard_subscription_needs_one_pattern_covering_all_it_can_match():
    grants = Policy([AccessRule(subscribe=["sensors/+/temp", "a", "a/+/#"])]).grants(ALICE)
    assert grants.allows(SUBSCRIBE, "sensors/kitchen/temp")
    assert grants.allows(SUBSCRIBE, "sensors/+/temp")
    assert not grants.allows(SUBSCRIBE, "sensors/#")
    assert not grants.allows(SUBSCRIBE, "sensors/+/+")
    # "a" and "a/+/#" together cover "a/#", but no one pattern does: denied, by design.
    assert not grants.allows(SUBSCRIBE, "a/#")


def test_a_narrowed_principal_gets_only_what_its_narrowing_covers():
    narrowed = Principal("alice", narrowed_to=("chat/#",))
    grants = Policy([AccessRule(publish=["#"], subscribe=["#"])]).grants(narrowed)
    assert grants.allows(PUBLISH, "chat/room1")
    assert not grants.allows(PUBLISH, "admin/reset")
    assert grants.allows(SUBSCRIBE, "chat/+")
    assert not grants.allows(SUBSCRIBE, "#")


def test_decisions_are_cached_within_a_bound():
    grants = Policy([AccessRule(publish=["even/#"])], cache_size=8).grants(ALICE)
    for n in range(200):
        topic = f"{'even' if n % 2 == 0 else 'odd'}/{n}"
        assert grants.allows(PUBLISH, topic) is (n % 2 == 0)
        assert len(grants._decided) <= 8
    assert grants.allows(PUBLISH, "even/0") and not grants.allows(PUBLISH, "odd/1")


@pytest.mark.parametrize(("rule", "match"), [
    (dict(publish=["a/%x"]), "no placeholder"),
    (dict(publish=["a/#/b"]), "'#' must be a whole level"),
    (dict(subscribe=["a+"]), "'\\+' must be a whole level"),
    (dict(publish="a/b"), "a list of patterns"),
    (dict(principal="alice", role="ops"), "not both"),
])
def test_a_bad_rule_is_refused_with_what_is_wrong(rule, match):
    with pytest.raises((ValueError, InvalidTopic), match=match):
        AccessRule(**rule)


def test_a_bad_narrowing_pattern_is_refused():
    with pytest.raises(InvalidTopic):
        Principal("alice", narrowed_to=("a/#/b",))


def test_the_decisions_a_connection_remembers_are_bounded_in_characters():
    from wireproto.access.policy import DECISION_CACHE_CHARACTERS

    grants = Policy([AccessRule(principal="device", publish=("#",))]).grants(
        Principal("device"))
    for number in range(2000):
        assert grants.allows(Action.PUBLISH, f"{number}/".ljust(1000, "x"))
        remembered = grants.decisions(Action.PUBLISH)
        assert sum(map(len, remembered)) <= DECISION_CACHE_CHARACTERS
    assert len(remembered) > 10  # it still remembers what fits
    assert grants.allows(Action.PUBLISH, "y" * (DECISION_CACHE_CHARACTERS + 1))
    assert sum(map(len, grants.decisions(Action.PUBLISH))) <= DECISION_CACHE_CHARACTERS
