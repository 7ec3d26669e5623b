"""Patch batches: what a maintenance unit publishes to ``kvc.patches`` for the edges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
from numpy.typing import NDArray

from kvcompass.frozen_init import field_builder
from kvcompass.index.patches import BucketImages, OthelloReset, TablePatch, WordImages
from kvcompass.wire._base import MAX_ITEMS, WireMessage, register
from kvcompass.wire._checks import (
    I64_MAX,
    PARTITION_MAX,
    U32_MAX,
    U64_MAX,
    Fields,
    WireError,
    build,
    check_array,
    check_bytes,
    check_int,
    check_range,
    check_str,
    check_tuple,
    kind_of,
    set_int,
    set_str,
)

__all__ = ["PatchBatch", "TablePatchWire", "TableReload"]

_U32: Final = np.dtype("<u4")
_U64: Final = np.dtype("<u8")
_CELL_DTYPES: Final = {32: "<u4", 64: "<u8"}
_FINGERPRINT_DTYPES: Final = {8: "u1", 16: "<u2"}
#: Longest ``PatchBatch.owner`` (a group id and a snapshot prefix).
MAX_OWNER_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class TableReload:
    """A reload patch on the wire: generation ``generation`` replaced the whole table.

    Not the view image inline but the Redis key of the snapshot holding it, which the
    edge loads. Wire keys (inside a :class:`TablePatchWire` map): ``g``
    generation (int 0..2^63-1), ``sk`` snapshot_key (str, non-empty).
    """

    generation: int
    snapshot_key: str

    def __post_init__(self) -> None:
        set_int(self, "generation", 0, I64_MAX)
        set_str(self, "snapshot_key")


@dataclass(frozen=True, slots=True, eq=False)
class TablePatchWire:
    """One table's patch inside a batch: a :class:`TablePatch` (without ``reload``) or a
    :class:`TableReload`. Compared by identity, like the index's patch types.

    Wire map (an element of ``PatchBatch`` ``"tb"``); ``b``, ``w`` and ``o`` are left out
    when there is nothing in them, and a reload has only ``id``, ``g`` and ``sk``:

    =====  ==================================  =========================================
    key    field                               encoding
    =====  ==================================  =========================================
    id     table_id                            int 0..2^32-1
    g      patch.generation                    int 0..2^63-1
    sk     patch.snapshot_key                  str (present: the patch is a TableReload)
    b      patch.buckets                       map, below (absent: None)
    b.i    patch.buckets.buckets               bin: n bucket ids, uint32 LE
    b.s    patch.buckets.seeds                 bin: n seeds, uint8
    b.vb   patch.buckets.cells (width)         int: 32 or 64, cell width in bits
    b.c    patch.buckets.cells                 bin: 4n cells, uint32/uint64 LE, row-major
    b.fb   patch.buckets.fingerprints (width)  int: 8 or 16 (present with ``b.f``)
    b.f    patch.buckets.fingerprints          bin: 4n fingerprints, uint8/uint16 LE
    w      patch.words                         map, below (absent: no word images)
    w.i    patch.words.indices                 bin: word indices, uint32 LE
    w.x    patch.words.values                  bin: word values, uint64 LE, same count
    o      patch.othello_reset                 map, below (absent: None)
    o.s    patch.othello_reset.othello_seed    int 0..2^64-1
    o.x    patch.othello_reset.words           bin: every word, 8 bytes each
    =====  ==================================  =========================================

    The patch's arrays are checked (dtype, shape, range) when this is built, so do not
    mutate them afterwards. Decoded arrays are read-only views of the message bytes
    (bucket and word indices: int64 copies).
    """

    table_id: int
    patch: TablePatch | TableReload

    def __post_init__(self) -> None:
        set_int(self, "table_id", 0, U32_MAX)
        if isinstance(self.patch, TablePatch):
            _check_patch(self.patch)
        elif not isinstance(self.patch, TableReload):
            raise WireError(
                f"expected TablePatch or TableReload, got {kind_of(self.patch)}", "patch"
            )

    @classmethod
    def of_table(cls, table_id: int, patch: TablePatch) -> TablePatchWire:
        """A patch just taken from a :class:`~kvcompass.index.ludo.LudoTable` (not a
        reload), without the checks: the table builds every array in its wire dtype and
        shape (a unit test holds its patches to the checks), and a maintenance unit's
        flush wraps one to a few per batch, where the checks cost about 5 µs each.
        ``table_id`` is a layout's table id. Anything else goes through the constructor.
        """
        return _build_table_patch(table_id, patch)

    def _body(self) -> dict[str, object]:
        patch = self.patch
        body: dict[str, object] = {"id": self.table_id, "g": int(patch.generation)}
        if isinstance(patch, TableReload):
            body["sk"] = patch.snapshot_key
            return body
        if patch.buckets is not None:
            body["b"] = _buckets_body(patch.buckets)
        if len(patch.words):
            body["w"] = {
                "i": patch.words.indices.astype(_U32).tobytes(),
                "x": patch.words.values.astype(_U64).tobytes(),
            }
        if patch.othello_reset is not None:
            reset = patch.othello_reset
            body["o"] = {"s": int(reset.othello_seed), "x": bytes(reset.words)}
        return body

    @classmethod
    def _from_body(cls, f: Fields) -> TablePatchWire:
        table_id = f.integer("id", "table_id")
        generation = f.integer("g", "patch.generation")
        patch: TablePatch | TableReload
        if f.has("sk"):
            for key, name in (("b", "buckets"), ("w", "words"), ("o", "othello_reset")):
                if f.has(key):
                    raise WireError(f"a reload carries no {name}", f.name(f"patch.{name}"))
            snapshot_key = f.text("sk", "patch.snapshot_key")
            patch = build(f.name("patch"), TableReload, generation, snapshot_key)
        else:
            buckets = _buckets(f.submap("b", "patch.buckets")) if f.has("b") else None
            words = WordImages()
            if f.has("w"):
                w = f.submap("w", "patch.words")
                indices = w.array("i", "indices", "<u4").astype(np.int64)
                words = WordImages(indices, w.array("x", "values", "<u8"))
            reset = None
            if f.has("o"):
                o = f.submap("o", "patch.othello_reset")
                reset = OthelloReset(o.integer("s", "othello_seed"), o.blob("x", "words"))
            patch = TablePatch(generation, buckets, words, reset)
        return build(f.path, cls, table_id, patch)


def _check_patch(patch: TablePatch) -> None:
    check_int(patch.generation, "patch.generation", 0, I64_MAX)
    if patch.reload is not None:
        raise WireError(
            "a view image does not travel inline; send a TableReload naming its snapshot",
            "patch.reload",
        )
    if patch.buckets is not None:
        _check_buckets(patch.buckets)
    words = patch.words
    if not isinstance(words, WordImages):
        raise WireError(f"expected WordImages, got {kind_of(words)}", "patch.words")
    indices = check_array(
        words.indices, "patch.words.indices", kinds="iu", sizes=(1, 2, 4, 8), shape=(-1,)
    )
    check_range(indices, "patch.words.indices", U32_MAX)
    check_array(words.values, "patch.words.values", kinds="u", sizes=(8,), shape=(len(indices),))
    reset = patch.othello_reset
    if reset is not None:
        if not isinstance(reset, OthelloReset):
            raise WireError(f"expected OthelloReset, got {kind_of(reset)}", "patch.othello_reset")
        check_int(reset.othello_seed, "patch.othello_reset.othello_seed", 0, U64_MAX)
        data = check_bytes(reset.words, "patch.othello_reset.words")
        if len(data) % 8:
            raise WireError(
                f"{len(data)} bytes is not a whole number of 64-bit words",
                "patch.othello_reset.words",
            )


def _check_buckets(images: object) -> None:
    if not isinstance(images, BucketImages):
        raise WireError(f"expected BucketImages, got {kind_of(images)}", "patch.buckets")
    name = "patch.buckets."
    ids = check_array(images.buckets, name + "buckets", kinds="iu", sizes=(1, 2, 4, 8), shape=(-1,))
    check_range(ids, name + "buckets", U32_MAX)
    n = len(ids)
    check_array(images.seeds, name + "seeds", kinds="u", sizes=(1,), shape=(n,))
    check_array(images.cells, name + "cells", kinds="u", sizes=(4, 8), shape=(n, 4))
    if images.fingerprints is not None:
        check_array(
            images.fingerprints, name + "fingerprints", kinds="u", sizes=(1, 2), shape=(n, 4)
        )


def _buckets_body(images: BucketImages) -> dict[str, object]:
    cells = images.cells
    body: dict[str, object] = {
        "i": images.buckets.astype(_U32).tobytes(),
        "s": images.seeds.tobytes(),
        "vb": 8 * cells.dtype.itemsize,
        "c": cells.astype(cells.dtype.newbyteorder("<")).tobytes(),
    }
    fps = images.fingerprints
    if fps is not None:
        body["fb"] = 8 * fps.dtype.itemsize
        body["f"] = fps.astype(fps.dtype.newbyteorder("<")).tobytes()
    return body


def _buckets(f: Fields) -> BucketImages:
    ids = f.array("i", "buckets", "<u4")
    n = len(ids)
    seeds = f.array("s", "seeds", "u1")
    cells = _square(f, "vb", "c", "cells", _CELL_DTYPES, n)
    fps = _square(f, "fb", "f", "fingerprints", _FINGERPRINT_DTYPES, n) if f.has("f") else None
    return BucketImages(ids.astype(np.int64), seeds, cells, fps)


def _square(
    f: Fields, width_key: str, key: str, name: str, dtypes: dict[int, str], n: int
) -> NDArray[Any]:
    """An (n, 4) array from a bin field whose element width sits in ``width_key``."""
    bits = f.integer(width_key, name)
    if bits not in dtypes:
        want = " or ".join(map(str, dtypes))
        raise WireError(f"width {width_key!r} must be {want} bits, got {bits}", f.name(name))
    values = f.array(key, name, dtypes[bits])
    if len(values) != 4 * n:
        raise WireError(f"expected 4 × {n} = {4 * n} values, got {len(values)}", f.name(name))
    return values.reshape(n, 4)


@register
@dataclass(frozen=True, slots=True, eq=False)
class PatchBatch(WireMessage):
    """One flush of a maintenance unit's shard, published to ``kvc.patches`` (partition =
    ``shard``). Compared by identity (it holds numpy arrays).

    ``epoch`` bumps whenever a maintenance unit takes the shard over; ``seq`` counts the
    batches of one (shard, epoch) without gaps, so an edge that sees a gap or a new epoch
    reloads the shard from its snapshot. The batch covers ``kvc.events`` offsets
    ``events_from..events_to`` inclusive (``events_to = events_from - 1``: none).
    ``owner`` names the writer of this patch stream, ``"<group_id>/<snapshot_prefix>"``
    (empty: written before 1.1): edges ignore batches of an owner they do not follow, and
    a maintenance unit counts only its own owner's epochs when it fences a takeover.

    Wire map, tag ``"patch_batch"``, version 1.1 (1.0 has no ``ow``, read as ``""``):

    ====  ==============  ===============================================
    key   field           encoding
    ====  ==============  ===============================================
    s     shard           int 0..2^31-1
    ep    epoch           int 0..2^63-1
    q     seq             int 0..2^63-1
    ef    events_from     int 0..2^63-1
    et    events_to       int -1..2^63-1, ≥ events_from - 1
    ts    produced_at_ns  int 0..2^63-1 (ns since the Unix epoch)
    tb    tables          array of :class:`TablePatchWire` maps (≤ 65536)
    ow    owner           str, ≤ 200 characters, optional (absent: "")
    ====  ==============  ===============================================
    """

    TAG: ClassVar[str] = "patch_batch"
    MAJOR: ClassVar[int] = 1
    MINOR: ClassVar[int] = 1

    shard: int
    epoch: int
    seq: int
    events_from: int
    events_to: int
    produced_at_ns: int
    tables: tuple[TablePatchWire, ...] = ()
    owner: str = ""

    def __post_init__(self) -> None:
        set_int(self, "shard", 0, PARTITION_MAX)
        set_int(self, "epoch", 0, I64_MAX)
        set_int(self, "seq", 0, I64_MAX)
        first = set_int(self, "events_from", 0, I64_MAX)
        last = set_int(self, "events_to", -1, I64_MAX)
        if first > last + 1:
            raise WireError(f"expected ≥ events_from - 1 = {first - 1}, got {last}", "events_to")
        set_int(self, "produced_at_ns", 0, I64_MAX)
        tables = check_tuple(self.tables, "tables", MAX_ITEMS)
        for i, table in enumerate(tables):
            if not isinstance(table, TablePatchWire):
                raise WireError(f"expected TablePatchWire, got {kind_of(table)}", f"tables[{i}]")
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "owner", _check_owner(self.owner))

    @classmethod
    def of_writer(
        cls,
        shard: int,
        epoch: int,
        seq: int,
        events_from: int,
        events_to: int,
        produced_at_ns: int,
        tables: tuple[TablePatchWire, ...],
        owner: str,
    ) -> PatchBatch:
        """A batch of fields a shard writer keeps valid (its shard and owner checked
        when it starts, its own counters, the patches it took, a clock reading it
        checks), built without the checks: a maintenance unit's flush makes one per
        shard and flush, where they cost about 2 µs."""
        return _build_batch(
            shard, epoch, seq, events_from, events_to, produced_at_ns, tables, owner
        )

    def _body(self) -> dict[str, object]:
        return {
            "s": self.shard,
            "ep": self.epoch,
            "q": self.seq,
            "ef": self.events_from,
            "et": self.events_to,
            "ts": self.produced_at_ns,
            "tb": [table._body() for table in self.tables],
            "ow": self.owner,
        }

    @classmethod
    def _from_body(cls, f: Fields) -> PatchBatch:
        return cls(
            shard=f.integer("s", "shard"),
            epoch=f.integer("ep", "epoch"),
            seq=f.integer("q", "seq"),
            events_from=f.integer("ef", "events_from"),
            events_to=f.integer("et", "events_to"),
            produced_at_ns=f.integer("ts", "produced_at_ns"),
            tables=tuple(TablePatchWire._from_body(t) for t in f.maps("tb", "tables")),
            owner=f.text("ow", "owner") if f.has("ow") else "",
        )


def _check_owner(value: object) -> str:
    """``value`` as a plain str of at most :data:`MAX_OWNER_CHARS` (empty allowed)."""
    if not isinstance(value, str):
        raise WireError(f"expected str, got {kind_of(value)}", "owner")
    if len(value) > MAX_OWNER_CHARS:
        raise WireError(f"{len(value)} characters exceed {MAX_OWNER_CHARS}", "owner")
    return check_str(value, "owner") if value else ""


#: Unchecked builds, field by field (:meth:`TablePatchWire.of_table`,
#: :meth:`PatchBatch.of_writer`).
_build_table_patch = field_builder(TablePatchWire)
_build_batch = field_builder(PatchBatch)
