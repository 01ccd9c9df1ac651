"""Principals, access rules, and the policy that grants a principal its topic patterns.

Patterns are the hub's (wireproto.topics): `/`-separated levels, `+` one level, `#` the rest.
In a rule's pattern `%u` is the principal's name, `%c` its client id and `%%` a percent sign. A
pattern whose placeholder has no value, or a value holding `/`, `+` or `#`, or beginning with
`$` (the broker's own `$SYS` topics), grants nothing: a name can never widen a rule. An
anonymous principal has no `%c`: a client chooses its client id, so only a named principal's,
which its protocol binds to that principal (a SubbleSocket registry's owner), means anything.

A subscription is allowed only if one granted pattern covers every topic it can match
(`pattern_covers`). Several patterns that only together cover it do not allow it: the check
stays a simple, predictable one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from wireproto.errors import InvalidTopic
from wireproto.topics import pattern_covers, validate_pattern

from .credentials import Credential

__all__ = ["ANONYMOUS", "AccessRule", "Action", "Grants", "Policy", "Principal"]


class Action(StrEnum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    CALL = "call"  # an RPC route or a UBRE request name
    SERVE = "serve"  # registering a handler for a route or name


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection is. `name` None is anonymous. `narrowed_to`, when set, are the only
    patterns within which any rule may grant anything (a token's own topic claim). `credential`
    is what proved it, when that can expire or be withdrawn; it is no part of who it is."""

    name: str | None = None
    roles: frozenset[str] = frozenset()
    client_id: str | None = None
    narrowed_to: tuple[str, ...] | None = None
    credential: Credential | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.roles, frozenset):
            object.__setattr__(self, "roles", frozenset(self.roles))
        if self.narrowed_to is not None:
            narrowed = tuple(self.narrowed_to)
            for pattern in narrowed:
                validate_pattern(pattern)
            object.__setattr__(self, "narrowed_to", narrowed)


ANONYMOUS = Principal()

_PLACEHOLDER = re.compile(r"%(.?)")
_WIDENING = re.compile(r"[/+#]")


@dataclass(frozen=True, slots=True)
class AccessRule:
    """Patterns granted per action to the principal named `principal`, to every principal with
    `role`, or, with neither, to everyone (anonymous connections included)."""

    principal: str | None = None
    role: str | None = None
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    call: tuple[str, ...] = ()
    serve: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.principal is not None and self.role is not None:
            raise ValueError("an access rule is for a principal or for a role, not both")
        for action in Action:
            patterns = getattr(self, action.value)
            if isinstance(patterns, str):
                raise ValueError(f"{action.value}: a list of patterns, not the string {patterns!r}")
            patterns = tuple(patterns)
            for pattern in patterns:
                _check_placeholders(pattern)
                filled = _substitute(pattern, "x", "x")
                if filled is not None:  # always: "x" is a safe value for each placeholder
                    validate_pattern(filled)
            object.__setattr__(self, action.value, patterns)

    def applies_to(self, principal: Principal) -> bool:
        if self.principal is not None:
            return principal.name == self.principal
        if self.role is not None:
            return self.role in principal.roles
        return True

    def patterns(self, action: Action) -> tuple[str, ...]:
        return getattr(self, action.value)


def _check_placeholders(pattern: str) -> None:
    for match in _PLACEHOLDER.finditer(pattern):
        if match[1] not in ("u", "c", "%"):
            raise InvalidTopic(
                f"pattern {pattern!r}: {match[0]!r} is no placeholder; use %u (the principal), "
                "%c (its client id), or %% for a percent sign"
            )


def _substitute(pattern: str, name: str | None, client_id: str | None) -> str | None:
    """`pattern` with its placeholders filled in, or None if one has no safe value."""
    if "%" not in pattern:
        return pattern
    missing = False

    def fill(match: re.Match[str]) -> str:
        nonlocal missing
        if match[1] == "%":
            return "%"
        value = name if match[1] == "u" else client_id
        if not value or value[0] == "$" or _WIDENING.search(value):
            missing = True
            return ""
        return value

    filled = _PLACEHOLDER.sub(fill, pattern)
    return None if missing else filled


class Policy:
    """The rules of a broker. `grants(principal)` gives what a connection may do; a session
    keeps it, so each topic is decided once per connection."""

    def __init__(self, rules: Iterable[AccessRule], *, cache_size: int = 1024,
                 allows_everything: bool = False) -> None:
        self.rules = tuple(rules)
        self.cache_size = cache_size
        self.allows_everything = allows_everything

    @classmethod
    def open(cls) -> Policy:
        """No authentication configured: everyone may do everything."""
        return cls((), allows_everything=True)

    def grants(self, principal: Principal) -> Grants:
        if self.allows_everything:
            return Grants(principal, None, self.cache_size)
        patterns: dict[Action, list[str]] = {action: [] for action in Action}
        # Anyone may use any client id anonymously: it names no one.
        client_id = principal.client_id if principal.name is not None else None
        for rule in self.rules:
            if not rule.applies_to(principal):
                continue
            for action in Action:
                for pattern in rule.patterns(action):
                    concrete = _substitute(pattern, principal.name, client_id)
                    if concrete is not None and concrete not in patterns[action]:
                        patterns[action].append(concrete)
        return Grants(
            principal, {action: tuple(found) for action, found in patterns.items()},
            self.cache_size,
        )


# The characters of topics whose decisions one connection's grants remember, per action.
DECISION_CACHE_CHARACTERS = 65_536


class Grants:
    """One principal's patterns per action, with the decisions made so far, per action (at most
    `cache_size` topics and DECISION_CACHE_CHARACTERS characters of them each, forgotten all
    at once when full, so a client that names endless or long topics cannot grow them)."""

    __slots__ = ("principal", "patterns", "_decided", "_cache_size", "_cached_characters")

    def __init__(self, principal: Principal, patterns: dict[Action, tuple[str, ...]] | None,
                 cache_size: int) -> None:
        self.principal = principal
        self.patterns = patterns  # None: everything is allowed
        self._decided: dict[Action, dict[str, bool]] = {action: {} for action in Action}
        self._cache_size = cache_size
        self._cached_characters: dict[Action, int] = dict.fromkeys(Action, 0)

    @property
    def allows_everything(self) -> bool:
        return self.patterns is None

    def allows(self, action: Action, topic: str) -> bool:
        """Whether the principal may `action` on `topic` (a subscription may be a pattern)."""
        decided = self._decided[action]
        allowed = decided.get(topic)
        if allowed is None:
            allowed = self._decide(action, topic)
            characters = self._cached_characters[action] + len(topic)
            if len(decided) >= self._cache_size or characters > DECISION_CACHE_CHARACTERS:
                decided.clear()
                characters = len(topic)
            if characters <= DECISION_CACHE_CHARACTERS:
                decided[topic] = allowed
                self._cached_characters[action] = characters
            else:
                self._cached_characters[action] = 0
        return allowed

    def decisions(self, action: Action) -> dict[str, bool]:
        """The decisions on `action` made so far, by topic: a caller on a hot path looks here
        first and calls `allows` only for a topic it does not find."""
        return self._decided[action]

    def same_as(self, other: Grants, action: Action) -> bool:
        """Whether `other` surely allows `action` on the very topics these grants do: the same
        patterns, within the same narrowing."""
        if self.patterns is None or other.patterns is None:
            return self.patterns is other.patterns
        return (self.patterns[action] == other.patterns[action]
                and self.principal.narrowed_to == other.principal.narrowed_to)

    def _decide(self, action: Action, topic: str) -> bool:
        if self.patterns is None:
            return True
        narrowed = self.principal.narrowed_to
        if narrowed is not None and not any(pattern_covers(p, topic) for p in narrowed):
            return False
        return any(pattern_covers(pattern, topic) for pattern in self.patterns[action])
