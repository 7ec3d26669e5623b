"""Shard snapshots in Redis, written atomically: new keys first, then a pointer swap.

Layout for shard ``s`` (``p`` = the configured prefix)::

    p:s:current            -> "v<n>"             (the pointer; swapped last)
    p:s:v<n>:meta          -> SnapshotMeta msgpack
    p:s:v<n>:view:<table>  -> sealed view image  (what edges fetch)
    p:s:v<n>:keys:<table>  -> raw key array      (what maintenance units also need)

A reader that follows the pointer always finds a complete version. The previous version
is kept one round (an edge may be reading it, or a TableReload may name it), older ones
are deleted.
"""

from __future__ import annotations

from typing import cast

import redis

from kvcompass.index.errors import SnapshotError
from kvcompass.snapshot import ShardSnapshot, SnapshotMeta

__all__ = ["SnapshotStore"]


class SnapshotStore:
    def __init__(self, client: redis.Redis, prefix: str = "kvc:snap") -> None:
        self._r = client
        self.prefix = prefix

    def _base(self, shard: int) -> str:
        return f"{self.prefix}:{shard}"

    def version_key(self, shard: int, version: str) -> str:
        """The name a TableReload carries: everything of one snapshot version."""
        return f"{self._base(shard)}:{version}"

    def save(self, snapshot: ShardSnapshot) -> str:
        """Store a snapshot and make it current; returns its version key."""
        shard = snapshot.meta.shard
        base = self._base(shard)
        number = int(self._r.incr(f"{base}:counter"))
        version = f"v{number}"
        vkey = self.version_key(shard, version)
        pipe = self._r.pipeline(transaction=False)
        pipe.set(f"{vkey}:meta", snapshot.meta.to_bytes())
        for table, image in snapshot.views.items():
            pipe.set(f"{vkey}:view:{table}", image)
        for table, keys in snapshot.keys.items():
            pipe.set(f"{vkey}:keys:{table}", keys)
        pipe.execute()
        previous = self._r.set(f"{base}:current", version, get=True)
        old = cast(bytes | None, self._r.get(f"{base}:previous"))
        self._r.set(f"{base}:previous", version if previous is None else previous)
        if old is not None and old.decode() not in (version, _text(previous)):
            self._delete_version(shard, old.decode(), snapshot)
        return vkey

    def _delete_version(self, shard: int, version: str, like: ShardSnapshot) -> None:
        vkey = self.version_key(shard, version)
        names = [f"{vkey}:meta"]
        names += [f"{vkey}:view:{t}" for t in like.views]
        names += [f"{vkey}:keys:{t}" for t in like.views]
        self._r.delete(*names)

    def current(self, shard: int) -> str | None:
        """The version key of the shard's current snapshot, or None."""
        version = self._r.get(f"{self._base(shard)}:current")
        return None if version is None else self.version_key(shard, _text(version))

    def load(self, shard: int, *, with_keys: bool = True) -> ShardSnapshot | None:
        """The shard's current snapshot (edges pass ``with_keys=False``), or None."""
        vkey = self.current(shard)
        return None if vkey is None else self.load_version(vkey, with_keys=with_keys)

    def load_meta(self, vkey: str) -> SnapshotMeta:
        raw_meta = cast(bytes | None, self._r.get(f"{vkey}:meta"))
        if raw_meta is None:
            raise SnapshotError(f"snapshot {vkey} is gone (superseded twice?)")
        return SnapshotMeta.from_bytes(raw_meta)

    def load_version(self, vkey: str, *, with_keys: bool = True) -> ShardSnapshot:
        meta = self.load_meta(vkey)
        tables = sorted(meta.generations)
        pipe = self._r.pipeline(transaction=False)
        for t in tables:
            pipe.get(f"{vkey}:view:{t}")
        if with_keys:
            for t in tables:
                pipe.get(f"{vkey}:keys:{t}")
        blobs = cast(list[bytes | None], pipe.execute())
        if any(b is None for b in blobs):
            raise SnapshotError(f"snapshot {vkey} is incomplete")
        views = {t: cast(bytes, blobs[i]) for i, t in enumerate(tables)}
        keys = (
            {t: cast(bytes, blobs[len(tables) + i]) for i, t in enumerate(tables)}
            if with_keys
            else {}
        )
        return ShardSnapshot(meta, views, keys)

    def load_view(self, vkey: str, table: int) -> bytes:
        image = cast(bytes | None, self._r.get(f"{vkey}:view:{table}"))
        if image is None:
            raise SnapshotError(f"snapshot {vkey} has no view of table {table}")
        return image


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)
