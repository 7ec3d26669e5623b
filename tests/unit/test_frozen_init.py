"""frozen_init replaces only __init__: a decorated dataclass is built, compared, hashed,
copied and refused exactly as the dataclass it decorates, and holds no extra reference.
A SlotBuilder builds the same object without __init__ (for values valid by
construction)."""

from __future__ import annotations

import dataclasses
import random
import sys
from typing import Any

import pytest

from kvcompass.frozen_init import SlotBuilder, field_builder, frozen_init
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


def test_a_slot_builder_builds_what_init_builds_without_its_checks() -> None:
    build = field_builder(Plain)
    assert build(1, "x", (2,), 3.0) == Plain(1, "x", (2,), 3.0)
    assert hash(build(1, "x", None, 1.5)) == hash(Plain(1, "x"))
    unchecked = build(-1, "x", None, 1.5)  # its maker vouches for it: no __post_init__
    assert unchecked.a == -1
    with pytest.raises(dataclasses.FrozenInstanceError):
        unchecked.a = 2  # type: ignore[misc]


def test_a_slot_builder_counts_values_and_names_only_slots() -> None:
    build = field_builder(Plain)
    with pytest.raises(TypeError, match="takes 4 values, not 2"):
        build(1, "x")
    with pytest.raises(TypeError, match="is not a slot"):
        SlotBuilder(Plain, ("a", "e"))


def test_a_slot_builder_allocates_as_object_new_would_or_refuses_the_class() -> None:
    """It allocates without calling object.__new__: only for classes where that call
    would allocate the same way (the object is a tracked, collectable instance)."""
    import abc
    import gc

    build = field_builder(Plain)
    made = build(1, "x", None, 1.5)
    assert type(made) is Plain
    assert gc.is_tracked(made)
    cycle: list[Any] = []
    cycle.append(build(1, "x", cycle, 1.5))
    del cycle
    gc.collect()  # a cycle through a built object is collectable (no crash, no leak)

    @dataclasses.dataclass(frozen=True, slots=True)
    class OwnNew:
        a: int

        def __new__(cls, *args: Any) -> OwnNew:
            return super().__new__(cls)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Abstract(abc.ABC):
        a: int

        @abc.abstractmethod
        def f(self) -> None: ...

    for cls in (OwnNew, Abstract):
        with pytest.raises(TypeError, match=r"abstract or has its own __new__"):
            SlotBuilder(cls, ("a",))


def test_a_slot_builder_owns_its_values_once() -> None:
    value = object()
    before = sys.getrefcount(value)
    build = field_builder(Plain)
    objects = [build(1, "x", value, 1.5) for _ in range(100)]
    assert sys.getrefcount(value) == before + 100
    del objects
    assert sys.getrefcount(value) == before


def test_the_patch_paths_values_are_built_alike() -> None:
    """The unchecked builds of the index's and the wire's patch path equal checked ones."""
    from kvcompass.index.ludo import LudoTable
    from kvcompass.pipeline.follower import PatchFollower, Position
    from kvcompass.wire import PatchBatch, TablePatchWire

    table = LudoTable.with_capacity(64, rng=random.Random(5))  # seeded: a patch with words
    for key in range(1, 21):
        table.write(key, 1)
    patch = table.take_patch()
    assert patch.buckets is not None
    assert len(patch.buckets) > 1
    assert len(patch.words) > 0
    assert not patch.is_empty
    assert patch.reload is None
    wire = TablePatchWire.of_table(3, patch)
    assert (wire.table_id, wire.patch) == (3, patch)
    batch = PatchBatch.of_writer(1, 2, 0, 1, 4, 5, (wire,), "mu")
    checked = PatchBatch(1, 2, 0, 1, 4, 5, (TablePatchWire(3, patch),), "mu")
    assert [
        getattr(batch, f.name) for f in dataclasses.fields(PatchBatch) if f.name != "tables"
    ] == [getattr(checked, f.name) for f in dataclasses.fields(PatchBatch) if f.name != "tables"]
    follower = PatchFollower(1)
    follower.position = Position("mu", 2, 0)
    follower.applied(batch)
    assert follower.position == Position("mu", 2, 1)
