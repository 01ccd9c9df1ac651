"""How a settings class says what its config table holds: one declaration, read from TOML.

A table of the config file (``[hub]``, ``[stream]``, ``[ubre]``...) is a frozen dataclass
declared by the code it configures, next to its ``DEFAULT_*`` constants. Each field is a key;
how a value is read comes from the field's type (`int`: a positive integer, `float`: a positive
number, `bool`, `str`, `tuple[str, ...]`), or from `setting(default, read=...)` where the type
says too little. A field that the code needs but a file must not set (a framing chosen per
listener, a callback) is `setting(default, in_config=False)`.

`table_readers(kind)` gives the readers of a settings class, which is all `wireproto.config`
needs to read, write and check a table. Nothing here imports the rest of wireproto.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, field, fields
from typing import Any

__all__ = [
    "Reader",
    "setting",
    "table_readers",
    "toml_value",
    "shown",
    "integer",
    "positive_integer",
    "positive_number",
    "seconds_or_never",
    "file_mode",
    "boolean",
    "string",
    "strings",
    "networks",
    "choice",
    "one_of",
]

Reader = Callable[[Any], Any]


def setting(default: Any = MISSING, *, read: Reader | None = None, in_config: bool = True,
            default_factory: Any = MISSING) -> Any:
    """A dataclass field that is a config key read by `read` (or, with `in_config` false, a
    field that no config file sets)."""
    return field(default=default, default_factory=default_factory,
                 metadata={"read": read, "in_config": in_config})


def toml_value(value: Any) -> str:
    """`value` written as TOML; TypeError for what a config table cannot hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # A TOML basic string is a JSON string for everything a config holds.
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def shown(value: Any) -> str:
    """A value as a TOML file spells it (true, "text"), for error messages."""
    try:
        return toml_value(value)
    except TypeError:
        return repr(value)


def one_of(values: Sequence[str] | Any) -> str:
    values = list(values)
    if len(values) == 1:
        return values[0]
    return ", ".join(values[:-1]) + " or " + values[-1]


def integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {shown(value)}")
    return value


def positive_integer(value: Any) -> int:
    if integer(value) <= 0:
        raise ValueError(f"must be a positive integer, not {value}")
    return value


def positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number of seconds, got {shown(value)}")
    if value <= 0:
        raise ValueError(f"must be positive, not {value}")
    return float(value)


def seconds_or_never(value: Any) -> float:
    """Seconds, or 0 for never."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"expected a number of seconds (0: never), got {shown(value)}")
    return float(value)


def file_mode(value: Any) -> int:
    """File permissions, written in TOML as an octal integer: 0o600."""
    if not 0 <= integer(value) <= 0o777:
        raise ValueError(f"expected permissions such as 0o600, got {value}")
    if not value & 0o600 == 0o600:
        raise ValueError(f"0o{value:o} does not let the broker read and write its own file")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {shown(value)}")
    return value


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {shown(value)}")
    return value


def strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"expected a list of strings, got {shown(value)}")
    return tuple(value)


def networks(value: Any) -> tuple[str, ...]:
    """A list of CIDR networks (a bare address is a network of one)."""
    cidrs = strings(value)
    for network in cidrs:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(
                f"{shown(network)} is not an IP network; write one as 10.0.0.0/8 or ::1"
            ) from None
    return cidrs


def choice(choices: Sequence[str], noun: str = "value") -> Reader:
    """A reader that takes one of `choices`; the error calls a wrong one an unknown `noun`."""
    def read(value: Any) -> str:
        value = string(value)
        if value not in choices:
            raise ValueError(f"unknown {noun} {shown(value)}; use {one_of(choices)}")
        return value

    return read


_BY_TYPE: dict[str, Reader] = {
    "int": positive_integer,
    "float": positive_number,
    "bool": boolean,
    "str": string,
    "tuple[str, ...]": strings,
}


def _reader(item: Field[Any]) -> Reader:
    read = item.metadata.get("read")
    if read is not None:
        return read
    kind = item.type if isinstance(item.type, str) else getattr(item.type, "__name__", "")
    read = _BY_TYPE.get(kind)
    if read is None:
        raise TypeError(f"the config key {item.name!r} ({kind}) needs setting(read=...)")
    return read


def table_readers(kind: type) -> dict[str, Reader]:
    """Each config key of the settings class `kind`, in declaration order, with its reader."""
    return {item.name: _reader(item) for item in fields(kind)
            if item.metadata.get("in_config", True)}
