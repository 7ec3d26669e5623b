"""KV event batches: what a worker tells its shards' maintenance units about its cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import FrozenInstanceError
from typing import Any, ClassVar, NoReturn

import numpy as np
from numpy.typing import NDArray

from kvcompass.frozen_init import SlotBuilder
from kvcompass.wire._base import MAX_ITEMS, WireMessage, register
from kvcompass.wire._checks import (
    I64_MAX,
    PARTITION_MAX,
    Fields,
    WireError,
    check_int,
    check_str,
    check_tuple,
    kind_of,
)
from kvcompass.wire._event import KVEvent
from kvcompass.wire._event_columns import (
    COLUMNS,
    EventColumns,
    check_columns,
    columns_of,
    events_of,
    own_columns,
)

__all__ = ["KVEventBatch"]

_HEADER = ("worker_id", "region", "worker_seq", "shard", "sent_at_ns", "worker_incarnation")
#: Wire keys of the columns, in EventColumns order.
_COLUMN_KEYS = ("k", "tr", "n", "ln", "ky")


@register
class KVEventBatch(WireMessage):
    """A worker's cache changes for one shard, published to ``kvc.events`` (partition =
    ``shard``; every key of the batch belongs to that shard). Immutable.

    ``worker_seq`` numbers the batches of one run of the worker (its
    ``worker_incarnation``, a random number the publisher picks at start) from 0, with
    no clock involved: a maintenance unit drops a batch of a known incarnation whose
    ``worker_seq`` is not above the last one it applied (a redelivery), and a new
    incarnation starts that worker's numbering afresh. ``sent_at_ns`` is the sender's
    wall clock (ns since the Unix epoch), informational only.

    The events are held as columns, all events concatenated (``*_array``, read-only), so
    decoding and applying a batch costs numpy calls per batch rather than Python work per
    event. :attr:`events` gives them as :class:`KVEvent` objects, built on first use.
    Build a batch from events (``KVEventBatch(..., events=(...))``) or from columns
    (:meth:`from_columns`).

    Wire map, tag ``"kv_events"``, version 2.1 (1.x, a map per event, is refused; 2.0
    has no ``wi``, read as incarnation 0):

    ====  ============  =========================================================
    key   field         encoding
    ====  ============  =========================================================
    w     worker_id     str, non-empty
    r     region        str, non-empty
    q     worker_seq    int 0..2^63-1
    s     shard         int 0..2^31-1
    ts    sent_at_ns    int 0..2^63-1
    wi    worker_incar- int 0..2^63-1, optional (absent: 0)
          nation
    k     kind          bin: per event, uint8: 1 ADMIT, 2 TIER, 3 EVICT (≤ 65536)
    tr    tier          bin: per event, uint8: 0 ABSENT (EVICT), 1 VRAM, 2 DRAM
    n     key count     bin: per event, uint32 LE, adding up to the keys below
    ln    key length    bin: per key, uint32 LE, > 0 (prefix length in tokens)
    ky    key           bin: per key, uint64 LE, < 2^63, same count as ``ln``
    ====  ============  =========================================================
    """

    __slots__ = ("_columns", "_events", *_HEADER)

    TAG: ClassVar[str] = "kv_events"
    MAJOR: ClassVar[int] = 2
    MINOR: ClassVar[int] = 1

    worker_id: str
    region: str
    worker_seq: int
    shard: int
    sent_at_ns: int
    worker_incarnation: int
    _columns: EventColumns
    _events: tuple[KVEvent, ...] | None

    def __init__(
        self,
        worker_id: str,
        region: str,
        worker_seq: int,
        shard: int,
        sent_at_ns: int,
        events: Sequence[KVEvent] = (),
        *,
        worker_incarnation: int = 0,
    ) -> None:
        self._set_header(worker_id, region, worker_seq, shard, sent_at_ns, worker_incarnation)
        events = check_tuple(events, "events", MAX_ITEMS)
        for i, event in enumerate(events):
            if not isinstance(event, KVEvent):
                raise WireError(f"expected KVEvent, got {kind_of(event)}", f"events[{i}]")
        object.__setattr__(self, "_columns", columns_of(events))
        object.__setattr__(self, "_events", events)

    @classmethod
    def from_columns(
        cls,
        worker_id: str,
        region: str,
        worker_seq: int,
        shard: int,
        sent_at_ns: int,
        *,
        kinds: NDArray[np.uint8],
        tiers: NDArray[np.uint8],
        counts: NDArray[np.uint32],
        lengths: NDArray[np.uint32],
        keys: NDArray[np.uint64],
        worker_incarnation: int = 0,
    ) -> KVEventBatch:
        """A batch of event columns laid out and typed as :attr:`kind_array` ..
        :attr:`key_array` (uint8, uint8, uint32, uint32, uint64); copied, then checked
        like decoded ones."""
        return cls._of(
            (worker_id, region, worker_seq, shard, sent_at_ns, worker_incarnation),
            own_columns((kinds, tiers, counts, lengths, keys)),
        )

    @classmethod
    def from_valid_columns(
        cls,
        worker_id: str,
        region: str,
        worker_seq: int,
        shard: int,
        sent_at_ns: int,
        *,
        kinds: NDArray[np.uint8],
        tiers: NDArray[np.uint8],
        counts: NDArray[np.uint32],
        lengths: NDArray[np.uint32],
        keys: NDArray[np.uint64],
        worker_incarnation: int = 0,
    ) -> KVEventBatch:
        """:meth:`from_columns` of a header and columns valid by construction, neither
        copied nor checked: the columns read-only, in the wire dtypes, passing every
        check a decoded batch's pass (a publisher's
        :class:`~kvcompass.event_buffers.ShardEventBuffers` builds them so), the header
        fields within their ranges (a publisher checks its worker's once)."""
        return _build_valid(
            worker_id,
            region,
            worker_seq,
            shard,
            sent_at_ns,
            worker_incarnation,
            EventColumns(kinds, tiers, counts, lengths, keys),
            None,
        )

    @classmethod
    def _of(cls, header: tuple[Any, ...], columns: EventColumns) -> KVEventBatch:
        """A batch of checked columns, without building events."""
        batch = object.__new__(cls)
        batch._set_header(*header)
        object.__setattr__(batch, "_columns", columns)
        object.__setattr__(batch, "_events", None)
        return batch

    def _set_header(
        self,
        worker_id: object,
        region: object,
        worker_seq: object,
        shard: object,
        ts: object,
        incarnation: object,
    ) -> None:
        put = object.__setattr__
        put(self, "worker_id", check_str(worker_id, "worker_id"))
        put(self, "region", check_str(region, "region"))
        put(self, "worker_seq", check_int(worker_seq, "worker_seq", 0, I64_MAX))
        put(self, "shard", check_int(shard, "shard", 0, PARTITION_MAX))
        put(self, "sent_at_ns", check_int(ts, "sent_at_ns", 0, I64_MAX))
        put(self, "worker_incarnation", check_int(incarnation, "worker_incarnation", 0, I64_MAX))

    # -- the events, per event and as columns ----------------------------------------

    @property
    def events(self) -> tuple[KVEvent, ...]:
        """The events as objects, in order (built on first use, then kept)."""
        events = self._events
        if events is None:
            events = events_of(self._columns)
            object.__setattr__(self, "_events", events)
        return events

    @property
    def columns(self) -> EventColumns:
        """The five arrays below at once, for a reader of several (a maintenance unit
        reads three per batch)."""
        return self._columns

    @property
    def kind_array(self) -> NDArray[np.uint8]:
        """Per event, its :class:`EventKind` value."""
        return self._columns.kinds

    @property
    def tier_array(self) -> NDArray[np.uint8]:
        """Per event, its tier (0 exactly for EVICT)."""
        return self._columns.tiers

    @property
    def count_array(self) -> NDArray[np.uint32]:
        """Per event, how many keys it holds (consecutive in the key columns)."""
        return self._columns.counts

    @property
    def length_array(self) -> NDArray[np.uint32]:
        """Per key, its prefix length in tokens."""
        return self._columns.lengths

    @property
    def key_array(self) -> NDArray[np.uint64]:
        """Per key, the key (every event's keys, in event order)."""
        return self._columns.keys

    def key_tiers(self) -> NDArray[np.uint8]:
        """Per key, its event's tier: the key's new 2-bit tier field (0 for EVICT)."""
        c = self._columns
        return np.repeat(c.tiers, c.counts)

    def event_of_key(self, j: int) -> int:
        """Index of the event holding key ``j`` of :attr:`key_array`."""
        if not 0 <= j < len(self._columns.keys):
            raise IndexError(f"key index {j} out of range")
        return int(np.searchsorted(np.cumsum(self._columns.counts), j, side="right"))

    @property
    def n_keys(self) -> int:
        """Keys over all events."""
        return len(self._columns.keys)

    # -- value semantics -------------------------------------------------------------

    def _header(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _HEADER)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVEventBatch):
            return NotImplemented
        return self._header() == other._header() and all(
            np.array_equal(a, b)
            for a, b in zip(self._columns.arrays(), other._columns.arrays(), strict=True)
        )

    def __hash__(self) -> int:
        return hash((self._header(), *(column.tobytes() for column in self._columns.arrays())))

    def __repr__(self) -> str:
        head = ", ".join(f"{name}={getattr(self, name)!r}" for name in _HEADER)
        return f"KVEventBatch({head}, events={len(self._columns.kinds)}, keys={self.n_keys})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (KVEventBatch.from_bytes, (self.to_bytes(),))

    # -- wire ------------------------------------------------------------------------

    def _body(self) -> dict[str, object]:
        body: dict[str, object] = {
            "w": self.worker_id,
            "r": self.region,
            "q": self.worker_seq,
            "s": self.shard,
            "ts": self.sent_at_ns,
            "wi": self.worker_incarnation,
        }
        for key, column in zip(_COLUMN_KEYS, self._columns.arrays(), strict=True):
            body[key] = column.tobytes()
        return body

    @classmethod
    def _from_body(cls, f: Fields) -> KVEventBatch:
        header = (
            f.text("w", "worker_id"),
            f.text("r", "region"),
            f.integer("q", "worker_seq"),
            f.integer("s", "shard"),
            f.integer("ts", "sent_at_ns"),
            f.integer("wi", "worker_incarnation") if f.has("wi") else 0,
        )
        columns = EventColumns(
            *(
                f.array(key, name, dtype)
                for key, (name, dtype) in zip(_COLUMN_KEYS, COLUMNS, strict=True)
            )
        )
        check_columns(columns)
        return cls._of(header, columns)


#: A batch of valid fields, slot by slot (:meth:`KVEventBatch.from_valid_columns`).
_build_valid: SlotBuilder[KVEventBatch] = SlotBuilder(
    KVEventBatch, (*_HEADER, "_columns", "_events")
)
