"""Workload parameters: dataclass fields that carry their meaning and their source, set
from text (``--set NAME=VALUE``) and listed by ``--help``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, ClassVar, Self, TypeVar

__all__ = ["MAX_TOKENS", "Params", "param"]

T = TypeVar("T")


def param(default: T, doc: str) -> T:
    """A parameter with its meaning (listed by ``kvcompass loadgen --help``)."""
    return field(default=default, metadata={"doc": doc})


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean")


#: How ``--set`` text becomes a parameter of the default's type: (what it must be, parser).
_PARSERS: dict[type, tuple[str, Any]] = {
    bool: ("true or false", _parse_bool),
    int: ("a whole number", int),
    float: ("a number", float),
}
#: Token ids are 32-bit.
_MAX_VOCAB = 1 << 32
#: The longest prompt part or answer a workload draws: past any model's context (a
#: synthetic ``user_tokens_max`` of 1e9 drew 12 GB for 20 requests).
MAX_TOKENS = 1 << 20


class Params:
    """Mixin of a frozen parameter dataclass; ``label`` names it in error messages."""

    label: ClassVar[str] = "workload"

    @classmethod
    def parameters(cls) -> list[tuple[str, object, str]]:
        """(name, default, meaning) of every parameter, for ``--help``."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        return [(f.name, f.default, f.metadata["doc"]) for f in fields]

    def with_values(self, values: dict[str, Any]) -> Self:
        """A copy with parameters set from text or values, typed by the defaults."""
        fields = {f.name: f.default for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown {self.label} parameters {unknown}; known: {sorted(fields)}")
        typed: dict[str, Any] = {}
        for name, value in values.items():
            default = fields[name]
            if not isinstance(value, str):
                typed[name] = value
                continue
            kind, parse = _PARSERS.get(type(default), ("text", str))
            try:
                typed[name] = parse(value)
            except ValueError:
                raise ValueError(
                    f"{self.label} parameter {name} must be {kind}, got {value!r}"
                ) from None
            # NaN passes range checks written "x < 1"; no parameter means inf.
            if isinstance(typed[name], float) and not math.isfinite(typed[name]):
                raise ValueError(f"{self.label} parameter {name} must be finite, got {value}")
        made = dataclasses.replace(self, **typed)  # type: ignore[type-var]
        made.check_by_name()
        return made

    def check_by_name(self) -> None:
        """ValueError for a parameter out of the range its name implies, after the
        config's own checks: a mean length of at least one token, any other mean
        positive, a spread (CV) and a Zipf exponent never negative, a longest part of at
        most :data:`MAX_TOKENS`, a vocabulary of 32-bit token ids. Each would otherwise
        reach a draw as "math domain error", "bad catalog: size 2000, length (...)", "high
        is out of bounds for uint32", or gigabytes of tokens."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            name, value = f.name, getattr(self, f.name)
            if name.endswith("_tokens_mean") and not value >= 1:
                raise ValueError(f"{name} must be >= 1 (tokens), got {value}")
            if name.endswith("_mean") and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
            if name.endswith(("_cv", "_zipf")) and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
            if name.endswith("_tokens_max") and not value <= MAX_TOKENS:
                raise ValueError(f"{name} must be <= {MAX_TOKENS}, got {value}")
            if name == "vocab" and not value <= _MAX_VOCAB:
                raise ValueError(f"vocab must be <= {_MAX_VOCAB} (32-bit token ids), got {value}")
