"""Shard snapshots: everything a maintenance unit or an edge needs to (re)start a shard.

A snapshot holds every table of one shard as two halves (the keyless view image and the
key image), the patch-stream position it corresponds to, and the per-worker event
sequence numbers the maintenance unit uses to drop duplicates. Edges read only the view
halves; the stored positions tell them where to resume the patch stream.

Every byte of every part is checksummed, and :meth:`ShardSnapshot.verify` checks the
parts against what the restorer expects (its shard, shard count and index layout), so a
corrupt or foreign snapshot is refused with an error naming the part, never restored.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack
import numpy as np
from isal.isal_zlib import crc32  # zlib's CRC-32, SIMD (pyproject: isal)

from kvcompass.index.errors import SnapshotError
from kvcompass.index.image import ImageHeader, ImageKind, open_image, open_key_image
from kvcompass.keys import shard_of_array

__all__ = ["ShardSnapshot", "SnapshotMeta"]

# v1 had no checksum; its snapshots are refused (the restorer falls back as for a lost one).
_META_VERSION = 2
_CRC = struct.Struct("<I")
_MAX_OWNER = 200
_MAX_DIGEST = 64
_I64 = (1 << 63) - 1
_MAX_SHARDS = 1 << 16
_MAX_TABLES = 1 << 16

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Positions and bookkeeping of one shard snapshot.

    ``next_seq`` is the seq of the first patch batch published after the snapshot (in
    ``epoch``); ``events_offset`` the last ``kvc.events`` offset whose effect it holds
    (-1: none); ``patches_offset`` the ``kvc.patches`` offset an edge resumes from.
    """

    shard: int
    epoch: int
    next_seq: int
    events_offset: int
    patches_offset: int
    generations: dict[int, int]
    worker_seq: dict[str, int] = field(default_factory=dict)
    created_ns: int = 0
    #: The writer of the shard's patch stream, "<group_id>/<snapshot_prefix>".
    owner: str = ""
    #: Shard count and ``IndexLayout.digest()`` the tables were written under.
    n_shards: int = 0
    topology_digest: str = ""

    def to_bytes(self) -> bytes:
        """msgpack, then the CRC32 of those bytes (4 bytes, little-endian)."""
        packed: bytes = msgpack.packb(
            {
                "v": _META_VERSION,
                "shard": self.shard,
                "epoch": self.epoch,
                "next_seq": self.next_seq,
                "events_offset": self.events_offset,
                "patches_offset": self.patches_offset,
                "generations": self.generations,
                "worker_seq": self.worker_seq,
                "created_ns": self.created_ns,
                "owner": self.owner,
                "n_shards": self.n_shards,
                "topology_digest": self.topology_digest,
            },
            use_bin_type=True,
        )
        return packed + _CRC.pack(crc32(packed))

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotMeta:
        """Decode :meth:`to_bytes`; refuse a bad checksum, version, type or range."""
        if len(data) < _CRC.size:
            raise SnapshotError(f"meta: {len(data)} bytes, too short for a snapshot meta")
        body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
        if crc32(body) != crc:
            raise SnapshotError("meta: checksum mismatch (corrupt snapshot meta)")
        try:
            raw: Any = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except (ValueError, msgpack.exceptions.UnpackException) as exc:
            raise SnapshotError(f"meta: not msgpack: {exc!r}") from exc
        if not isinstance(raw, dict):
            raise SnapshotError("meta: not a map")
        if raw.get("v") != _META_VERSION:
            raise SnapshotError(f"meta: unknown format version {raw.get('v')!r}")
        fields = _Fields(raw)
        n_shards = fields.integer("n_shards", 0, _MAX_SHARDS)
        return cls(
            # 0 shards: a meta written before the count was recorded; verify() refuses it.
            shard=fields.integer("shard", 0, n_shards - 1 if n_shards else _MAX_SHARDS),
            epoch=fields.integer("epoch", 0, _I64),
            next_seq=fields.integer("next_seq", 0, _I64),
            events_offset=fields.integer("events_offset", -1, _I64),
            patches_offset=fields.integer("patches_offset", 0, _I64),
            generations=fields.mapping(
                "generations", _checked_int(0, _MAX_TABLES), _checked_int(0, _I64)
            ),
            worker_seq=fields.mapping(
                "worker_seq", _checked_str(_MAX_OWNER), _checked_int(0, _I64)
            ),
            created_ns=fields.integer("created_ns", 0, _I64),
            owner=fields.string("owner", _MAX_OWNER),
            n_shards=n_shards,
            topology_digest=fields.string("topology_digest", _MAX_DIGEST),
        )


class _Fields:
    """Typed reads of a decoded meta map; every error names the field."""

    def __init__(self, raw: dict[Any, Any]) -> None:
        self._raw = raw

    def _get(self, name: str) -> Any:
        if name not in self._raw:
            raise SnapshotError(f"meta: field {name!r} is missing")
        return self._raw[name]

    def integer(self, name: str, lo: int, hi: int) -> int:
        return _named(name, _checked_int(lo, hi))(self._get(name))

    def string(self, name: str, max_len: int) -> str:
        return _named(name, _checked_str(max_len))(self._get(name))

    def mapping(
        self, name: str, key: Callable[[Any], T], value: Callable[[Any], int]
    ) -> dict[T, int]:
        raw = self._get(name)
        if not isinstance(raw, dict):
            raise SnapshotError(f"meta: field {name!r} is not a map")
        return {_named(name, key)(k): _named(name, value)(v) for k, v in raw.items()}


def _named(name: str, check: Callable[[Any], T]) -> Callable[[Any], T]:
    def named(x: Any) -> T:
        try:
            return check(x)
        except ValueError as exc:
            raise SnapshotError(f"meta: field {name!r}: {exc}") from None

    return named


def _checked_int(lo: int, hi: int) -> Callable[[Any], int]:
    def check(x: Any) -> int:
        if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= hi:
            raise ValueError(f"{x!r} is not an integer in {lo}..{hi}")
        return x

    return check


def _checked_str(max_len: int) -> Callable[[Any], str]:
    def check(x: Any) -> str:
        if not isinstance(x, str) or len(x) > max_len:
            raise ValueError(f"{x!r:.80} is not a string of at most {max_len} characters")
        return x

    return check


@dataclass(frozen=True, slots=True)
class ShardSnapshot:
    meta: SnapshotMeta
    #: table id -> view image (sealed, checksummed)
    views: dict[int, bytes]
    #: table id -> key image (sealed, names its view); empty when only views were loaded
    keys: dict[int, bytes] = field(default_factory=dict)

    def verify(self, *, shard: int, n_shards: int, topology_digest: str) -> None:
        """Refuse a snapshot that is corrupt or not of this shard, shard count and layout.

        Checks the meta against the expectations, every view image (checksums, and the
        generation the meta records), and every key image (checksums, paired with its
        view, every key owned by ``shard``). Raises :class:`SnapshotError` whose message
        starts with the part: ``meta``, ``view:<table>`` or ``keys:<table>``.
        """
        meta = self.meta
        expected = (shard, n_shards, topology_digest)
        found = (meta.shard, meta.n_shards, meta.topology_digest)
        for what, want, got in zip(("shard", "n_shards", "topology"), expected, found, strict=True):
            if want != got:
                raise SnapshotError(f"meta: snapshot is for {what} {got!r}, expected {want!r}")
        if set(self.views) != set(meta.generations):
            raise SnapshotError(
                f"meta: records tables {sorted(meta.generations)}, "
                f"the snapshot has views of {sorted(self.views)}"
            )
        if self.keys and set(self.keys) != set(self.views):
            raise SnapshotError(
                f"keys: tables {sorted(self.keys)} do not match the views' {sorted(self.views)}"
            )
        for table_id, image in sorted(self.views.items()):
            header = _part(f"view:{table_id}", open_image, image, ImageKind.VIEW)
            if header.geometry.generation != meta.generations[table_id]:
                raise SnapshotError(
                    f"view:{table_id}: generation {header.geometry.generation}, "
                    f"the meta records {meta.generations[table_id]}"
                )
            if table_id in self.keys:
                self._verify_keys(table_id, header, shard, n_shards)

    def _verify_keys(self, table_id: int, view: ImageHeader, shard: int, n_shards: int) -> None:
        name = f"keys:{table_id}"
        keys = _part(name, open_key_image, self.keys[table_id], view)
        held = keys[keys >= 0].astype(np.uint64)
        owners = shard_of_array(held, n_shards)
        foreign = np.flatnonzero(owners != shard)
        if len(foreign):
            j = int(foreign[0])
            raise SnapshotError(
                f"{name}: key {int(held[j])} belongs to shard {int(owners[j])}, not {shard} "
                f"({len(foreign)} foreign keys)"
            )


def _part(name: str, open_part: Callable[..., T], *args: Any) -> T:
    """``open_part(*args)``, prefixing a SnapshotError's message with the part's name."""
    try:
        return open_part(*args)
    except SnapshotError as exc:
        raise SnapshotError(f"{name}: {exc}") from exc
