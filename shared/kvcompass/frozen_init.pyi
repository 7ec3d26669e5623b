"""Types of the compiled frozen-dataclass initialiser (frozen_init.pyx); the docstrings
are there."""

from typing import Any, Generic, TypeVar

from typing_extensions import disjoint_base

__all__ = ["SlotBuilder", "field_builder", "frozen_init"]

_T = TypeVar("_T", bound=type)
_C = TypeVar("_C")

def frozen_init(cls: _T) -> _T: ...

@disjoint_base
class SlotBuilder(Generic[_C]):
    def __init__(self, cls: type[_C], names: tuple[str, ...]) -> None: ...
    def __call__(self, *values: Any) -> _C: ...

def field_builder(cls: type[_C]) -> SlotBuilder[_C]: ...
