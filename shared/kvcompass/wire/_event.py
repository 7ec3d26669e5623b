"""One KV event (kind, tier, keys) and the scalar checks that word every event error."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kvcompass.index.layout import Tier
from kvcompass.wire._checks import I64_MAX, U32_MAX, WireError, check_int, check_tuple, kind_of

__all__ = ["EventKind", "KVEvent", "check_kind", "check_pair", "check_tier"]


class EventKind(IntEnum):
    """What happened to an event's keys on the worker."""

    #: Newly cached, in the event's tier.
    ADMIT = 1
    #: Moved to the event's tier (VRAM ↔ DRAM).
    TIER = 2
    #: Dropped from the worker; the event's tier is ABSENT (0).
    EVICT = 3


def check_kind(value: object) -> EventKind:
    return EventKind(check_int(value, "kind", 1, 3))


def check_tier(kind: EventKind, value: object) -> Tier:
    tier = Tier(check_int(value, "tier", 0, 2))
    if kind is EventKind.EVICT and tier is not Tier.ABSENT:
        raise WireError(f"EVICT carries tier 0, got {int(tier)}", "tier")
    if kind is not EventKind.EVICT and tier is Tier.ABSENT:
        raise WireError(f"{kind.name} needs tier 1..2 (VRAM, DRAM), got 0", "tier")
    return tier


def check_pair(pair: object, i: int) -> tuple[int, int]:
    field = f"keys[{i}]"
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise WireError(f"expected a (length, key) pair, got {kind_of(pair)}", field)
    length = check_int(pair[0], f"{field}.length", 1, U32_MAX)
    return length, check_int(pair[1], f"{field}.key", 0, I64_MAX)


def _keys(value: object) -> tuple[tuple[int, int], ...]:
    items = check_tuple(value, "keys")
    for pair in items:  # fast path: already exact (int, int) tuples in range
        if not (
            type(pair) is tuple
            and len(pair) == 2
            and type(pair[0]) is int
            and type(pair[1]) is int
            and 0 < pair[0] <= U32_MAX
            and 0 <= pair[1] <= I64_MAX
        ):
            break
    else:
        return items
    return tuple(check_pair(pair, i) for i, pair in enumerate(items))


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One change to some of a worker's cached prefixes, all of the same kind and tier.

    ``keys`` are (length, key) pairs: the prefix length in tokens (> 0, < 2^32) and its
    63-bit key (``kvcompass.keys``). ``tier`` is where the keys now are: VRAM or DRAM for
    ADMIT and TIER, ABSENT (0) for EVICT. Ints are accepted for ``kind`` and ``tier`` and
    stored as the enums.

    The per-event view of a :class:`KVEventBatch`, which holds and sends its events as
    columns; this is for code that wants one object per event (the publisher's callers,
    tests, reference models), not for the maintenance unit's hot path.
    """

    kind: EventKind
    tier: Tier
    keys: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        kind = check_kind(self.kind)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "tier", check_tier(kind, self.tier))
        object.__setattr__(self, "keys", _keys(self.keys))
