"""Workload parameters: dataclass fields that carry their meaning and their source, set
from text (``--set NAME=VALUE``) and listed by ``--help``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, ClassVar, Self, TypeVar

__all__ = ["Params", "param"]

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
            elif isinstance(default, bool):
                typed[name] = _parse_bool(value)
            elif isinstance(default, int):
                typed[name] = int(value)
            elif isinstance(default, float):
                number = float(value)
                # NaN passes range checks written "x < 1"; no parameter means inf.
                if not math.isfinite(number):
                    raise ValueError(f"{self.label} parameter {name} must be finite, got {value}")
                typed[name] = number
            else:
                typed[name] = value
        return dataclasses.replace(self, **typed)  # type: ignore[type-var]
