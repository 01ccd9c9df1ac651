"""Hub topics as NATS subjects, and back (docs/cluster.md, "Subjects").

A hub topic is any string; its levels are separated by `/`, and a level may be empty or hold
`.`, `*`, `>`, spaces or any other character. A NATS subject is made of non-empty tokens
separated by `.`, where `*` and `>` are wildcards and whitespace ends the subject. So each level
becomes one token: the characters ``A-Z a-z 0-9 - _ ~`` stand for themselves, every other
character is written as ``%XX`` for each byte of its UTF-8 form, and an empty level is a lone
``%``. No token made this way is a wildcard, and each decodes to exactly one level, so the
mapping is total and reversible.

A pattern's `+` level becomes `*`. A last `#` matches its parent too, which a NATS `>` does
not, so ``a/#`` needs two subjects: ``...a`` and ``...a.>``; the pattern ``#`` alone is ``>``.
"""

from __future__ import annotations

import re

__all__ = ["SubjectError", "Subjects", "safe_token"]

_PLAIN_TOPIC = re.compile(r"(?:[A-Za-z0-9_~-]+/)*[A-Za-z0-9_~-]+")
_PLAIN_LEVEL = re.compile(r"[A-Za-z0-9_~-]+")
_ESCAPED = re.compile(r"[^A-Za-z0-9_~-]")
_TOKEN = re.compile(r"(?:[A-Za-z0-9_~-]|%[0-9A-F]{2})+|%")
_CACHE_SIZE = 4096
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class SubjectError(ValueError):
    """A subject that no hub topic maps to (another NATS client's, not wireproto's)."""


def _escape_level(level: str) -> str:
    if not level:
        return "%"
    if _PLAIN_LEVEL.fullmatch(level):
        return level
    return _ESCAPED.sub(
        lambda found: "".join(
            f"%{byte:02X}" for byte in found.group().encode("utf-8", "surrogatepass")),
        level,
    )


def _unescape_token(token: str) -> str:
    if token == "%":
        return ""
    if "%" not in token:
        return token
    parts = token.split("%")
    raw = bytearray(parts[0].encode())
    for part in parts[1:]:
        raw.append(int(part[:2], 16))
        raw += part[2:].encode()
    return raw.decode("utf-8", "surrogatepass")


def safe_token(text: str) -> str:
    """`text` with every character but ``A-Z a-z 0-9 _ -`` made ``_``: a subject token, a
    JetStream stream or key name (not reversible; for names wireproto makes itself)."""
    return _UNSAFE.sub("_", text)


class Subjects:
    """The subjects of one cluster, all under `prefix` (a NATS subject without wildcards):
    topics under ``PREFIX.topic.``, calls under ``PREFIX.call.``, and the brokers' own traffic
    under ``PREFIX.cluster.``."""

    def __init__(self, prefix: str = "wireproto") -> None:
        tokens = prefix.split(".")
        if not all(token and token not in ("*", ">") and not any(c.isspace() for c in token)
                   for token in tokens):
            raise ValueError(f"subject prefix {prefix!r} must be a NATS subject without "
                             "wildcards or spaces")
        self.prefix = prefix
        self.topics = f"{prefix}.topic."
        self.calls = f"{prefix}.call."
        self.cluster = f"{prefix}.cluster."
        self._cache: dict[str, str] = {}

    def topic(self, topic: str) -> str:
        """The subject a publish on `topic` goes to."""
        subject = self._cache.get(topic)
        if subject is None:
            if _PLAIN_TOPIC.fullmatch(topic):
                subject = self.topics + topic.replace("/", ".")
            else:
                subject = self.topics + ".".join(map(_escape_level, topic.split("/")))
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            self._cache[topic] = subject
        return subject

    def pattern(self, pattern: str) -> tuple[str, ...]:
        """The subjects to subscribe to for a hub pattern (a valid one) or exact topic."""
        levels = pattern.split("/")
        if levels == ["#"]:
            return (self.topics + ">",)
        tokens = ["*" if level == "+" else _escape_level(level) for level in levels]
        if levels[-1] == "#":
            parent = self.topics + ".".join(tokens[:-1])
            return (parent, parent + ".>")
        return (self.topics + ".".join(tokens),)

    def topic_of(self, subject: str) -> str:
        """The hub topic of a subject under ``PREFIX.topic.``; SubjectError if it has none."""
        if not subject.startswith(self.topics):
            raise SubjectError(f"subject {subject!r} is not under {self.topics!r}")
        tokens = subject[len(self.topics):].split(".")
        for token in tokens:
            if not _TOKEN.fullmatch(token):
                raise SubjectError(f"subject {subject!r}: {token!r} is not an escaped level")
        try:
            return "/".join(map(_unescape_token, tokens))
        except UnicodeDecodeError as error:
            raise SubjectError(f"subject {subject!r} is not UTF-8 once unescaped") from error

    def call(self, protocol: str, name: str | None) -> str:
        """The subject of the calls to `name` (a UBRE request name, a nydus route...) of
        `protocol`; `name` is mapped as a topic is, so it is never a wildcard. None is the
        protocol's unnamed call (UBRE's default handler), one token shorter than any name's."""
        if name is None:
            return self.calls + protocol
        return self.calls + protocol + "." + self.topic(name)[len(self.topics):]
