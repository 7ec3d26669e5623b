"""A KV event batch as columns: their wire dtypes and the vectorised checks.

All events of a batch are concatenated: per event its kind, tier and key count, per key
its length and key. Checking them costs a few numpy calls per batch, not Python work per
event or key. An error still names the first bad element by its per-event path
(``events[3].tier``, ``events[3].keys[1].key``), worded by the scalar checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.wire._base import MAX_ITEMS
from kvcompass.wire._checks import I64_MAX, WireError, check_array
from kvcompass.wire._event import EventKind, KVEvent, check_kind, check_pair, check_tier

__all__ = [
    "COLUMNS",
    "EventColumns",
    "check_columns",
    "columns_of",
    "events_of",
    "events_valid",
    "own_columns",
]


class EventColumns(NamedTuple):
    """Per event: ``kinds``, ``tiers``, ``counts`` (keys); per key: ``lengths``, ``keys``."""

    kinds: NDArray[np.uint8]
    tiers: NDArray[np.uint8]
    counts: NDArray[np.uint32]
    lengths: NDArray[np.uint32]
    keys: NDArray[np.uint64]

    def arrays(self) -> tuple[NDArray[Any], ...]:
        """The five columns, for code that treats them alike."""
        return (self.kinds, self.tiers, self.counts, self.lengths, self.keys)


#: (field name in errors, wire dtype) of each column, in EventColumns order.
COLUMNS: Final[tuple[tuple[str, np.dtype[Any]], ...]] = (
    ("events.kind", np.dtype("u1")),
    ("events.tier", np.dtype("u1")),
    ("events.key_count", np.dtype("<u4")),
    ("events.keys.length", np.dtype("<u4")),
    ("events.keys.key", np.dtype("<u8")),
)


#: The column dtypes by name.
(_, _KIND_T), (_, _TIER_T), (_, _COUNT_T), (_, _LENGTH_T), (_, _KEY_T) = COLUMNS


def _class_table(classes: dict[int, int], other: int) -> bytes:
    table = bytearray([other]) * 256
    for value, cls in classes.items():
        table[value] = cls
    return bytes(table)


# Kind and tier bytes translated so that they are equal exactly where the (kind, tier)
# pair is valid: 1..2 (ADMIT, TIER) with 1..2 (VRAM, DRAM), 3 (EVICT) with 0 (ABSENT).
# Any other value maps to a byte the other table never produces. bytes.translate runs in
# C, so checking every event costs well under a microsecond, far less than numpy here.
# A unit test holds this to the scalar checks over every uint8 pair.
_KIND_CLASS: Final = _class_table({1: 1, 2: 1, 3: 0}, 0xFE)
_TIER_CLASS: Final = _class_table({1: 1, 2: 1, 0: 0}, 0xFF)


def events_valid(kinds: bytes, tiers: bytes) -> bool:
    """Whether every (kind, tier) pair is valid (``kinds`` and ``tiers`` equally long)."""
    return kinds.translate(_KIND_CLASS) == tiers.translate(_TIER_CLASS)


def _scalar_error(path: str, check: Callable[[], object]) -> WireError:
    """The error ``check`` raises, seen from ``path``: the vectorised check found one."""
    try:
        check()
    except WireError as exc:
        return exc.within(path)
    raise AssertionError(f"{path}: the vectorised and scalar event checks disagree")


def check_columns(c: EventColumns) -> None:
    """Raise :class:`WireError` naming the first bad element; columns have wire dtypes."""
    n = len(c.kinds)
    if n > MAX_ITEMS:
        raise WireError(f"{n} items exceed the limit of {MAX_ITEMS}", "events")
    if len(c.tiers) != n or len(c.counts) != n:
        raise WireError(f"{n} kinds, {len(c.tiers)} tiers and {len(c.counts)} key counts", "events")
    if not events_valid(c.kinds.tobytes(), c.tiers.tobytes()):
        classes = np.frombuffer(_KIND_CLASS, np.uint8)[c.kinds]
        i = int((classes != np.frombuffer(_TIER_CLASS, np.uint8)[c.tiers]).argmax())
        kind, tier = int(c.kinds[i]), int(c.tiers[i])
        raise _scalar_error(f"events[{i}]", lambda: check_tier(check_kind(kind), tier))
    n_keys = len(c.keys)
    if len(c.lengths) != n_keys:
        raise WireError(f"{len(c.lengths)} lengths but {n_keys} keys", "events.keys")
    total = int(c.counts.sum(dtype=np.uint64))
    if total != n_keys:
        raise WireError(f"key counts add up to {total}, but there are {n_keys} keys", "events")
    if n_keys and (not c.lengths.all() or c.keys.max() > I64_MAX):
        j = int(((c.lengths == 0) | (c.keys > I64_MAX)).argmax())
        ends = np.cumsum(c.counts, dtype=np.int64)
        i = int(np.searchsorted(ends, j, side="right"))
        k = j - int(ends[i] - c.counts[i])
        pair = (int(c.lengths[j]), int(c.keys[j]))
        raise _scalar_error(f"events[{i}]", lambda: check_pair(pair, k))


def own_columns(arrays: Sequence[object]) -> EventColumns:
    """Copies of caller-given arrays in the wire dtypes (which they must have), checked."""
    copies = []
    for value, (name, dtype) in zip(arrays, COLUMNS, strict=True):
        array = check_array(value, name, kinds="u", sizes=(dtype.itemsize,), shape=(-1,))
        copies.append(_frozen(np.array(array, dtype=dtype)))
    columns = EventColumns(*copies)
    check_columns(columns)
    return columns


def columns_of(events: Sequence[KVEvent]) -> EventColumns:
    """The columns of events that are already checked (KVEvent checks itself)."""
    n = len(events)
    pairs = np.array([pair for event in events for pair in event.keys], dtype=np.uint64)
    pairs = pairs.reshape(-1, 2)
    return EventColumns(
        _frozen(np.fromiter((e.kind for e in events), _KIND_T, n)),
        _frozen(np.fromiter((e.tier for e in events), _TIER_T, n)),
        _frozen(np.fromiter((len(e.keys) for e in events), _COUNT_T, n)),
        _frozen(pairs[:, 0].astype(_LENGTH_T)),
        _frozen(pairs[:, 1].astype(_KEY_T)),
    )


def events_of(c: EventColumns) -> tuple[KVEvent, ...]:
    """One :class:`KVEvent` per event (checked columns: nothing here can fail)."""
    pairs = list(zip(c.lengths.tolist(), c.keys.tolist(), strict=True))
    events = []
    start = 0
    for kind, tier, count in zip(
        c.kinds.tolist(), c.tiers.tolist(), c.counts.tolist(), strict=True
    ):
        events.append(KVEvent(EventKind(kind), Tier(tier), tuple(pairs[start : start + count])))
        start += count
    return tuple(events)


def _frozen(array: NDArray[Any]) -> NDArray[Any]:
    array.setflags(write=False)
    return array
