"""Shard snapshots: everything a maintenance unit or an edge needs to (re)start a shard.

A snapshot holds every table of one shard as two halves (the keyless view image and the
full key array), the patch-stream position it corresponds to, and the per-worker event
sequence numbers the maintenance unit uses to drop duplicates. Edges read only the view
halves; the stored positions tell them where to resume the patch stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from kvcompass.index.errors import SnapshotError

__all__ = ["ShardSnapshot", "SnapshotMeta"]

_META_VERSION = 1


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
        return packed

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotMeta:
        try:
            raw: Any = msgpack.unpackb(data, raw=False, strict_map_key=False)
            if not isinstance(raw, dict) or raw.get("v") != _META_VERSION:
                raise SnapshotError("snapshot meta has an unknown format version")
            return cls(
                shard=int(raw["shard"]),
                epoch=int(raw["epoch"]),
                next_seq=int(raw["next_seq"]),
                events_offset=int(raw["events_offset"]),
                patches_offset=int(raw["patches_offset"]),
                generations={int(k): int(v) for k, v in raw["generations"].items()},
                worker_seq={str(k): int(v) for k, v in raw["worker_seq"].items()},
                created_ns=int(raw["created_ns"]),
                owner=str(raw.get("owner", "")),
                n_shards=int(raw.get("n_shards", 0)),
                topology_digest=str(raw.get("topology_digest", "")),
            )
        except SnapshotError:
            raise
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            msgpack.exceptions.UnpackException,
        ) as exc:
            raise SnapshotError(f"corrupt snapshot meta: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class ShardSnapshot:
    meta: SnapshotMeta
    #: table id -> view image (sealed, checksummed)
    views: dict[int, bytes]
    #: table id -> raw key array; empty when only the views were loaded (edges)
    keys: dict[int, bytes] = field(default_factory=dict)
