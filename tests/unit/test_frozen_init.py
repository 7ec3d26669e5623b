"""frozen_init replaces only __init__: a decorated dataclass is built, compared, hashed,
copied and refused exactly as the dataclass it decorates, and holds no extra reference."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

from kvcompass.frozen_init import frozen_init
from kvcompass.index.discovery import Match, MultiLevelQuery
from kvcompass.loadgen.sim.records import LoadSample, SimRecord
from kvcompass.routing.policy import Decision, Feedback, RegionQueues, RouteRequest
from kvcompass.worker.cache_values import CacheMatch, PrefixChange
from kvcompass.worker.completion import Request, Timings


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str
    c: Any = None
    d: float = 1.5

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


@frozen_init
@dataclasses.dataclass(frozen=True, slots=True)
class Fast:
    """Plain, decorated."""

    a: int
    b: str
    c: Any = None
    d: float = 1.5

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1, "x"), {}), ((1, "x", (2,)), {"d": 3.0}), ((), {"b": "y", "a": 2, "c": None})],
)
def test_built_alike(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    plain, fast = Plain(*args, **kwargs), Fast(*args, **kwargs)
    assert dataclasses.astuple(plain) == dataclasses.astuple(fast)
    assert repr(fast) == repr(plain).replace("Plain", "Fast")
    assert hash(fast) == hash(Fast(*args, **kwargs))
    assert fast == Fast(*args, **kwargs)
    assert dataclasses.replace(fast, d=9.0).d == 9.0


def test_still_frozen_and_still_checked() -> None:
    fast = Fast(1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.a = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="a must be >= 0"):  # its __post_init__ runs
        Fast(-1, "x")
    with pytest.raises(TypeError, match="missing"):
        Fast(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword"):
        Fast(1, "x", e=2)  # type: ignore[call-arg]


def test_values_are_owned_once_and_released_with_the_object() -> None:
    value = object()
    before = sys.getrefcount(value)
    objects = [Fast(1, "x", value) for _ in range(100)]
    assert sys.getrefcount(value) == before + 100
    objects[0].__init__(2, "y", None)  # type: ignore[misc]  # a rewrite drops the old value
    assert sys.getrefcount(value) == before + 99
    del objects
    assert sys.getrefcount(value) == before


def test_a_class_it_would_not_build_alike_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class InitOnly:
        a: int
        b: dataclasses.InitVar[int]

    for cls, message in [
        (NoSlots, "not a frozen slotted"),
        (NotFrozen, "not a frozen slotted"),
        (Factory, "only plain positional"),
        (InitOnly, "takes more than its fields"),
    ]:
        with pytest.raises(TypeError, match=message):
            frozen_init(cls)


@pytest.mark.parametrize(
    "cls",
    [RouteRequest, Decision, RegionQueues, Feedback, Request, Timings, CacheMatch,
     PrefixChange, SimRecord, LoadSample, Match, MultiLevelQuery],
)  # fmt: skip
def test_the_request_paths_values_use_it(cls: type) -> None:
    assert cls.__init__.__code__.co_names[0] == "_write"  # type: ignore[misc]
