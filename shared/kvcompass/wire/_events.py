"""KV events: what a worker tells its shards' maintenance units about its cache."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from kvcompass.index.layout import Tier
from kvcompass.wire._base import MAX_ITEMS, WireMessage, register
from kvcompass.wire._checks import (
    I64_MAX,
    PARTITION_MAX,
    U32_MAX,
    Fields,
    WireError,
    build,
    check_int,
    check_tuple,
    kind_of,
    set_int,
    set_str,
)

__all__ = ["EventKind", "KVEvent", "KVEventBatch"]


class EventKind(IntEnum):
    """What happened to an event's keys on the worker."""

    #: Newly cached, in the event's tier.
    ADMIT = 1
    #: Moved to the event's tier (VRAM ↔ DRAM).
    TIER = 2
    #: Dropped from the worker; the event's tier is ABSENT (0).
    EVICT = 3


def _kind(value: object) -> EventKind:
    return EventKind(check_int(value, "kind", 1, 3))


def _tier(kind: EventKind, value: object) -> Tier:
    tier = Tier(check_int(value, "tier", 0, 2))
    if kind is EventKind.EVICT and tier is not Tier.ABSENT:
        raise WireError(f"EVICT carries tier 0, got {int(tier)}", "tier")
    if kind is not EventKind.EVICT and tier is Tier.ABSENT:
        raise WireError(f"{kind.name} needs tier 1..2 (VRAM, DRAM), got 0", "tier")
    return tier


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
    return tuple(_pair(pair, i) for i, pair in enumerate(items))


def _pair(pair: object, i: int) -> tuple[int, int]:
    field = f"keys[{i}]"
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise WireError(f"expected a (length, key) pair, got {kind_of(pair)}", field)
    length = check_int(pair[0], f"{field}.length", 1, U32_MAX)
    return length, check_int(pair[1], f"{field}.key", 0, I64_MAX)


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One change to some of a worker's cached prefixes, all of the same kind and tier.

    ``keys`` are (length, key) pairs: the prefix length in tokens (> 0, < 2^32) and its
    63-bit key (``kvcompass.keys``). ``tier`` is where the keys now are: VRAM or DRAM for
    ADMIT and TIER, ABSENT (0) for EVICT. Ints are accepted for ``kind`` and ``tier`` and
    stored as the enums.

    Wire map (an element of ``KVEventBatch`` ``"e"``):

    ====  =====  ==============================================================
    key   field  encoding
    ====  =====  ==============================================================
    k     kind   int: 1 ADMIT, 2 TIER, 3 EVICT
    tr    tier   int 0..2: 0 ABSENT, 1 VRAM, 2 DRAM
    ln    keys   bin: every pair's length, uint32 little-endian
    ky    keys   bin: every pair's key, uint64 little-endian (same count as ``ln``)
    ====  =====  ==============================================================
    """

    kind: EventKind
    tier: Tier
    keys: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        kind = _kind(self.kind)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "tier", _tier(kind, self.tier))
        object.__setattr__(self, "keys", _keys(self.keys))

    def _body(self) -> dict[str, object]:
        n = len(self.keys)
        lengths, keys = zip(*self.keys, strict=True) if n else ((), ())
        return {
            "k": int(self.kind),
            "tr": int(self.tier),
            "ln": struct.pack(f"<{n}I", *lengths),
            "ky": struct.pack(f"<{n}Q", *keys),
        }

    @classmethod
    def _from_body(cls, f: Fields) -> KVEvent:
        lengths = f.array("ln", "keys", "<u4")
        keys = f.array("ky", "keys", "<u8")
        if len(lengths) != len(keys):
            raise WireError(f"{len(lengths)} lengths but {len(keys)} keys", f.name("keys"))
        kind = build(f.path, _kind, f.integer("k", "kind"))
        tier = build(f.path, _tier, kind, f.integer("tr", "tier"))
        pairs = tuple(zip(lengths.tolist(), keys.tolist(), strict=True))
        return build(f.path, cls, kind, tier, pairs)


@register
@dataclass(frozen=True, slots=True)
class KVEventBatch(WireMessage):
    """A worker's cache changes for one shard, published to ``kvc.events`` (partition =
    ``shard``; every key of the batch belongs to that shard).

    ``worker_seq`` numbers the worker's batches, increasing monotonically: a maintenance
    unit drops a batch whose ``worker_seq`` is not above the last one it applied from that
    worker (a redelivery). ``sent_at_ns`` is the sender's wall clock (ns since the Unix
    epoch).

    Wire map, tag ``"kv_events"``, version 1.0:

    ====  ============  ===================================================
    key   field         encoding
    ====  ============  ===================================================
    w     worker_id     str, non-empty
    r     region        str, non-empty
    q     worker_seq    int 0..2^63-1
    s     shard         int 0..2^31-1
    ts    sent_at_ns    int 0..2^63-1
    e     events        array of :class:`KVEvent` maps (at most 65536)
    ====  ============  ===================================================
    """

    TAG: ClassVar[str] = "kv_events"
    MAJOR: ClassVar[int] = 1
    MINOR: ClassVar[int] = 0

    worker_id: str
    region: str
    worker_seq: int
    shard: int
    sent_at_ns: int
    events: tuple[KVEvent, ...] = ()

    def __post_init__(self) -> None:
        set_str(self, "worker_id")
        set_str(self, "region")
        set_int(self, "worker_seq", 0, I64_MAX)
        set_int(self, "shard", 0, PARTITION_MAX)
        set_int(self, "sent_at_ns", 0, I64_MAX)
        events = check_tuple(self.events, "events", MAX_ITEMS)
        for i, event in enumerate(events):
            if not isinstance(event, KVEvent):
                raise WireError(f"expected KVEvent, got {kind_of(event)}", f"events[{i}]")
        object.__setattr__(self, "events", events)

    @property
    def n_keys(self) -> int:
        """Keys over all events."""
        return sum(len(e.keys) for e in self.events)

    def _body(self) -> dict[str, object]:
        return {
            "w": self.worker_id,
            "r": self.region,
            "q": self.worker_seq,
            "s": self.shard,
            "ts": self.sent_at_ns,
            "e": [event._body() for event in self.events],
        }

    @classmethod
    def _from_body(cls, f: Fields) -> KVEventBatch:
        return cls(
            worker_id=f.text("w", "worker_id"),
            region=f.text("r", "region"),
            worker_seq=f.integer("q", "worker_seq"),
            shard=f.integer("s", "shard"),
            sent_at_ns=f.integer("ts", "sent_at_ns"),
            events=tuple(KVEvent._from_body(e) for e in f.maps("e", "events")),
        )
