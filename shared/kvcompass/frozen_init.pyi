"""Types of the compiled frozen-dataclass initialiser (frozen_init.pyx); the docstrings
are there."""

from typing import TypeVar

__all__ = ["frozen_init"]

_T = TypeVar("_T", bound=type)

def frozen_init(cls: _T) -> _T: ...
