"""Route patterns for nydus paths: a port of ruta3 2.0.1 (npm), the router nydus and
nydus-client use.

nydus (server) matches each INVOKE's path against its registered routes, and nydus-client matches
each PUBLISH's path; both do it with ruta3, so wireproto does it the same way. A pattern is
turned into a regular expression exactly as ruta3's ``pathToRegExp`` does:

- ``:name`` captures one path segment (``[^/]+?``) as the param ``name``;
- ``:name?`` makes it optional, together with the ``/`` (or ``.``) before it;
- ``:name(regex)`` captures what `regex` matches instead; ruta3 rewrites every ``*`` in it as
  ``{0,}`` and every ``.`` as "any character" (``[\\s\\S]``), so ``(a.*z)`` means ``a``, anything,
  then ``z``;
- ``.:name`` (a dot before a param) is a format suffix: ``/:file.:ext``;
- ``*`` is a splat: anything at all (``.*``), captured into `splats`;
- ``/(`` opens a group that takes the slash in: ``/(x)?`` makes ``/x`` optional;
- a trailing ``/`` is always optional, and matching ignores case.

Routes are tried in the order they were added; the first that matches wins (`Match.next` goes on
to the next one, as ruta3's ``next`` does). A capture is decoded with JavaScript's
``decodeURIComponent`` semantics (``%2F`` becomes ``/``, escapes are UTF-8). Where
``decodeURIComponent`` would throw (``%ZZ``, a lone ``%``, escapes that are not UTF-8), ruta3 2.0.1
throws URIError out of ``match``; wireproto keeps that capture as it was written instead, which is
what ruta3's own test suite expects (``/cat/%`` gives the splat ``%``).

A pattern may also be a compiled `re.Pattern`, used as it is: all its groups become splats.

String patterns are JavaScript regular expressions once rewritten. They are translated to Python's
`re` so that they mean what they mean in JavaScript: ``.`` stops at any line terminator, ``\\d``,
``\\w``, ``\\s`` and ``\\b`` have their JavaScript (ASCII; JavaScript's whitespace) meaning, ``$``
is the end of the path, ``(?<name>...)`` is a named group. Case folding outside ASCII follows
Python's rules, which differ from JavaScript's in a few letters: U+0130, U+0131, U+017F (long s)
and U+212A (Kelvin) match ``[a-z]`` here and not there, and do not match ``[\\W]`` here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Match", "RouteTable", "path_to_regexp", "decode_uri_component", "route_key", "route_of_key",
]

# -- pathToRegExp -------------------------------------------------------------------------------

# ruta3's /(\/)?(\.)?:(\w+)(?:(\(.*?\)))?(\?)?|\*/g, with JavaScript's ASCII \w and its `.`,
# which stops at line terminators.
_TOKEN = re.compile(
    r"(/)?(\.)?:([A-Za-z0-9_]+)(?:(\([^\n\r\u2028\u2029]*?\)))?(\?)?|\*"
)
_SLASH_OR_DOT = re.compile(r"([/.])")


def path_to_regexp(pattern: str) -> tuple[re.Pattern[str], list[str | None]]:
    """ruta3's pathToRegExp: the compiled expression for `pattern`, and the name of each of its
    captures in order (None for a splat).

    Raises ValueError when the rewritten pattern is not a valid regular expression (JavaScript
    throws SyntaxError there too), or uses JavaScript syntax Python's `re` lacks.
    """
    keys: list[str | None] = []

    def tweak(match: re.Match[str]) -> str:
        if match[0] == "*":
            keys.append(None)
            return "*"
        slash, format_, key, capture, optional = match.groups()
        keys.append(key)
        slash = slash or ""
        if capture:
            capture = capture.replace("*", "{0,}").replace(".", "[\\s\\S]")
        return (
            ("" if optional else slash)
            + "(?:"
            + (slash if optional else "")
            + (format_ or "")
            + (capture or "([^/]+?)")
            + ")"
            + (optional or "")
        )

    source = (pattern + "/?").replace("/(", "(?:/")
    source = _TOKEN.sub(tweak, source)
    source = _SLASH_OR_DOT.sub(r"\\\1", source)
    source = source.replace("*", "(.*)")
    try:
        compiled = re.compile(_python_regex("^" + source + "$"), re.IGNORECASE)
    except re.error as error:
        raise ValueError(
            f"route pattern {pattern!r} makes the regular expression {source!r}, which is not "
            f"valid: {error}"
        ) from None
    return compiled, keys


# What JavaScript's escapes and `.` mean, spelled so Python's `re` means the same.
_JS_SPACE = (
    "\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
)
_JS_WORD = "A-Za-z0-9_"
_JS_DIGIT = "0-9"
# Scoped case-sensitive, so Python's Unicode case folding cannot add letters to them (under
# IGNORECASE, Python's [A-Za-z] also matches U+0130, U+0131, U+017F and U+212A).
_OUTSIDE_CLASS = {
    "d": f"(?-i:[{_JS_DIGIT}])",
    "D": f"(?-i:[^{_JS_DIGIT}])",
    "w": f"(?-i:[{_JS_WORD}])",
    "W": f"(?-i:[^{_JS_WORD}])",
    "s": f"(?-i:[{_JS_SPACE}])",
    "S": f"(?-i:[^{_JS_SPACE}])",
    "b": f"(?-i:(?<=[{_JS_WORD}])(?![{_JS_WORD}])|(?<![{_JS_WORD}])(?=[{_JS_WORD}]))",
    "B": f"(?-i:(?<=[{_JS_WORD}])(?=[{_JS_WORD}])|(?<![{_JS_WORD}])(?![{_JS_WORD}]))",
}
# Inside a class a negated escape becomes the ranges around what it excludes. \W's leaves out
# the four letters Python folds to ASCII ones, or [\W] would match k, s and i under IGNORECASE.
_INSIDE_CLASS = {
    "d": _JS_DIGIT,
    "D": "\\x00-/:-\\U0010ffff",
    "w": _JS_WORD,
    "W": "\\x00-/:-@\\[-\\^`{-\\u012f\\u0132-\\u017e\\u0180-\\u2129\\u212b-\\U0010ffff",
    "s": _JS_SPACE,
    "S": "\\x00-\\x08\\x0e-\\x1f!-\\x9f\\xa1-\\u167f\\u1681-\\u1fff\\u200b-\\u2027"
    "\\u202a-\\u202e\\u2030-\\u205e\\u2060-\\u2fff\\u3001-\\ufefe\\uff00-\\U0010ffff",
    "b": "\\x08",  # backspace, in a class
}
# Escapes both languages read alike; any other letter escape is the letter itself in
# JavaScript (an identity escape), and something else or an error in Python.
_SAME_ESCAPES = frozenset("nrtfvxu0123456789")
_ANY_BUT_LINE_END = "[^\\n\\r\\u2028\\u2029]"


def _python_regex(source: str) -> str:
    """A JavaScript regular expression (no flags but i, no u) as a Python one."""
    out: list[str] = []
    in_class = False
    i = 0
    size = len(source)
    while i < size:
        char = source[i]
        if char == "\\" and i + 1 < size:
            following = source[i + 1]
            i += 2
            table = _INSIDE_CLASS if in_class else _OUTSIDE_CLASS
            if following in table:
                out.append(table[following])
            elif following == "c" and i < size and source[i].isascii() and source[i].isalpha():
                out.append(f"\\x{ord(source[i]) % 32:02x}")  # \cJ is a control character
                i += 1
            elif following.isascii() and following.isalpha() and following not in _SAME_ESCAPES:
                out.append(following)
            else:
                out.append("\\" + following)
            continue
        i += 1
        if in_class:
            if char == "]":
                in_class = False
                out.append(char)
            elif char in "[&~|":
                out.append("\\" + char)  # literal in JavaScript; Python warns of set syntax
            else:
                out.append(char)
            continue
        if char == "[":
            if source.startswith("^]", i):  # [^] is any character at all
                out.append("[\\s\\S]")
                i += 2
            elif source.startswith("]", i):  # [] matches nothing
                out.append("(?!)")
                i += 1
            else:
                in_class = True
                out.append(char)
                if source.startswith("^", i):
                    out.append("^")
                    i += 1
        elif char == ".":
            out.append(_ANY_BUT_LINE_END)
        elif char == "{" and source.startswith(",", i):
            out.append("\\{")  # JavaScript reads {,5} as text; Python as {0,5}
        elif char == "$":
            out.append("\\Z")  # JavaScript's $ never matches before a final newline
        elif char == "(" and source.startswith("?<", i) and not source.startswith(
            ("?<=", "?<!"), i
        ):
            out.append("(?P<")
            i += 2
        else:
            out.append(char)
    return "".join(out)


# -- decodeURIComponent -------------------------------------------------------------------------

_ESCAPES = re.compile(r"(?:%[0-9A-Fa-f]{2})+")


def decode_uri_component(text: str) -> str | None:
    """JavaScript's decodeURIComponent: every %XX escape run read as UTF-8. None where
    JavaScript throws URIError (a '%' that does not start an escape, or bytes that are not
    UTF-8; JavaScript also refuses UTF-8 for surrogates and overlong forms, as Python does)."""
    if "%" not in text:
        return text
    pieces: list[str] = []
    done = 0
    for run in _ESCAPES.finditer(text):
        if "%" in text[done : run.start()]:
            return None
        pieces.append(text[done : run.start()])
        try:
            pieces.append(bytes.fromhex(run[0].replace("%", "")).decode("utf-8"))
        except UnicodeDecodeError:
            return None
        done = run.end()
    if "%" in text[done:]:
        return None
    pieces.append(text[done:])
    return "".join(pieces)


def _decode_capture(value: str | None) -> str | None:
    if value is None:
        return None
    decoded = decode_uri_component(value)
    return value if decoded is None else decoded


# -- the route table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Route:
    pattern: str
    regex: re.Pattern[str]
    keys: list[str | None]
    action: Any
    # Added as a compiled re.Pattern, not a ruta3 pattern string.
    compiled: bool = False


@dataclass(frozen=True)
class Match:
    """A path that matched a route: ruta3's match object.

    `route` is the pattern as it was added (a regex route's source). `params` maps each
    ``:name`` to its decoded capture (None for an optional param that matched nothing),
    `splats` lists the other captures in order, `action` is what was added with the route,
    `path` the path that matched and `index` the route's position in the router.
    """

    route: str
    params: dict[str, str | None]
    splats: list[str | None]
    action: Any
    path: str = ""
    index: int = 0
    _table: RouteTable | None = field(default=None, repr=False, compare=False)

    def next(self) -> Match | None:
        """The next route after this one that matches the same path (ruta3's `next`)."""
        if self._table is None:
            return None
        return self._table.match(self.path, start=self.index + 1)


class RouteTable:
    """Routes tried in the order they were added; `match` returns the first that matches."""

    def __init__(self) -> None:
        self.routes: list[_Route] = []

    def __len__(self) -> int:
        return len(self.routes)

    def add(self, pattern: str | re.Pattern[str], action: Any) -> None:
        """Add a route (ruta3's addRoute). ValueError for an empty pattern, one that makes an
        invalid regular expression, or a None action."""
        keys: list[str | None]
        if isinstance(pattern, re.Pattern):
            regex, keys, source = pattern, [], pattern.pattern
        elif isinstance(pattern, str):
            if not pattern:
                raise ValueError("a route requires a path pattern")
            regex, keys = path_to_regexp(pattern)
            source = pattern
        else:
            raise TypeError(
                f"a route pattern is a str or a compiled re.Pattern, not {type(pattern).__name__}"
            )
        if action is None:
            raise ValueError(f"route {source!r} requires an action")
        self.routes.append(_Route(source, regex, keys, action, isinstance(pattern, re.Pattern)))

    # ruta3's name
    add_route = add

    def match(self, path: str, start: int = 0) -> Match | None:
        """The first route from `start` on that matches `path`, or None."""
        for index in range(start, len(self.routes)):
            found = self.match_route(index, path)
            if found is not None:
                return found
        return None

    def match_route(self, index: int, path: str) -> Match | None:
        """The match of `path` by the route at `index` alone, or None."""
        route = self.routes[index]
        found = route.regex.search(path)
        if found is None:
            return None
        params: dict[str, str | None] = {}
        splats: list[str | None] = []
        keys = route.keys
        for position, value in enumerate(found.groups()):
            key = keys[position] if position < len(keys) else None
            if key:
                params[key] = _decode_capture(value)
            else:
                splats.append(_decode_capture(value))
        return Match(route.pattern, params, splats, route.action, path, index, self)


def route_key(route: _Route) -> str:
    """A route's name among the broker processes: ``p`` and its pattern, or ``r``, a compiled
    pattern's flags, ``/`` and its source."""
    if route.compiled:
        return f"r{route.regex.flags}/{route.regex.pattern}"
    return "p" + route.pattern


def route_of_key(key: str | None) -> str | re.Pattern[str]:
    """The pattern of the route `route_key` named; ValueError if `key` names none."""
    if isinstance(key, str) and key.startswith("p"):
        return key[1:]
    if isinstance(key, str) and key.startswith("r") and "/" in key:
        flags, source = key[1:].split("/", 1)
        return re.compile(source, int(flags))
    raise ValueError(f"not a route's key: {key!r}")
