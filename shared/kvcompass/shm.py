"""Edge views in shared memory: one writer (the replayer), many lock-free readers.

Layout: a control segment ``<prefix>-ctl`` plus one segment per table generation holding
that table's view image (:mod:`kvcompass.index.image`). The control segment has, per
shard, a sequence lock counter, the last applied patch seq, the epoch and a ready flag;
per table, its generation and the name of its current segment.

Readers never lock. They read the shard's counter, look up, and read it again: an odd or
changed counter means the writer was mid-batch, so they retry (a sequence lock). A table
that grew lives in a new segment; readers see the new name in the control segment and
re-attach. Writers publish names and generations under the same sequence lock. This
relies on the writer's stores becoming visible in order, which x86-64 guarantees.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import TypeVar

from kvcompass.index.errors import SnapshotError
from kvcompass.index.image import ImageHeader, layout_of
from kvcompass.index.patches import TablePatch
from kvcompass.index.view import LudoView

__all__ = ["SharedIndexReader", "SharedIndexWriter", "TornRead"]

T = TypeVar("T")

_MAGIC = b"KVCSHM01"
_HEAD = struct.Struct("<8sII")  # magic, shards, tables
_SHARD = struct.Struct("<QqqQ")  # seqlock, applied seq, epoch, ready
_TABLE = struct.Struct("<Q56s")  # generation, segment name
_SPINS = 64  # busy retries before yielding the CPU to the writer
_WAIT_LIMIT_S = 5.0  # a reader gives up (TornRead) after the writer held a shard this long


class TornRead(RuntimeError):
    """A reader could not get a consistent read (the writer held the shard too long)."""


def _ctl_size(n_shards: int, n_tables: int) -> int:
    return _HEAD.size + n_shards * _SHARD.size + n_shards * n_tables * _TABLE.size


#: Segments this process created (a writer here owns them and their tracking).
_CREATED_HERE: set[str] = set()


def _untrack(shm: shared_memory.SharedMemory) -> None:
    # Python's resource tracker would unlink a segment when the *attaching* process
    # exits; only the writer owns segment lifetimes. A reader in the writer's own
    # process must leave the writer's registration alone.
    if shm.name in _CREATED_HERE:
        return
    with contextlib.suppress(KeyError, AttributeError):
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]


def _buf(shm: shared_memory.SharedMemory) -> memoryview:
    buf = shm.buf
    if buf is None:  # pragma: no cover - only after close()
        raise SnapshotError(f"shared memory segment {shm.name} is closed")
    return buf


@dataclass
class _Layout:
    n_shards: int
    n_tables: int

    def shard_offset(self, shard: int) -> int:
        return _HEAD.size + shard * _SHARD.size

    def table_offset(self, shard: int, table: int) -> int:
        return (
            _HEAD.size + self.n_shards * _SHARD.size + (shard * self.n_tables + table) * _TABLE.size
        )


class SharedIndexWriter:
    """Owns the segments; applies patches and reloads under per-shard sequence locks."""

    def __init__(self, prefix: str, n_shards: int, n_tables: int) -> None:
        self.prefix = prefix
        self._layout = _Layout(n_shards, n_tables)
        size = _ctl_size(n_shards, n_tables)
        _remove_stale(prefix)
        self._ctl = shared_memory.SharedMemory(f"{prefix}-ctl", create=True, size=size)
        _CREATED_HERE.add(self._ctl.name)
        _buf(self._ctl)[:size] = bytes(size)
        _HEAD.pack_into(_buf(self._ctl), 0, _MAGIC, n_shards, n_tables)
        self._counters = [
            _buf(self._ctl)[o : o + 8].cast("Q")
            for o in (self._layout.shard_offset(s) for s in range(n_shards))
        ]
        self._segments: dict[tuple[int, int], shared_memory.SharedMemory] = {}
        self._views: dict[tuple[int, int], LudoView] = {}
        self._retired: list[shared_memory.SharedMemory] = []
        self._nonce = 0

    # -- the sequence lock ---------------------------------------------------------

    def _begin(self, shard: int) -> None:
        self._counters[shard][0] += 1  # odd: readers retry

    def _end(self, shard: int) -> None:
        self._counters[shard][0] += 1  # even again: a consistent state

    # -- writes --------------------------------------------------------------------

    def load_table(self, shard: int, table: int, image: bytes) -> None:
        """Install a table image (bootstrap or reload) in a fresh segment."""
        header = ImageHeader.unpack(image)
        self._nonce += 1
        name = f"{self.prefix}-s{shard}t{table}g{header.geometry.generation}n{self._nonce}"
        seg = shared_memory.SharedMemory(name, create=True, size=len(image))
        _CREATED_HERE.add(seg.name)
        _buf(seg)[: len(image)] = image
        view = LudoView.attach(_buf(seg)[: len(image)])
        self._begin(shard)
        old = self._segments.get((shard, table))
        self._segments[(shard, table)] = seg
        self._views[(shard, table)] = view
        _TABLE.pack_into(
            _buf(self._ctl),
            self._layout.table_offset(shard, table),
            header.geometry.generation,
            name.encode(),
        )
        self._end(shard)
        if old is not None:
            # Readers still mapping the old segment keep a valid mapping after unlink.
            self._retired.append(old)
            self._reap()

    def apply(self, shard: int, patches: Mapping[int, TablePatch]) -> None:
        """Apply one batch of table patches to a shard atomically for readers."""
        # A new Othello seed changes the image header, which attached readers cached:
        # such a table moves to a new segment, as a reload does.
        for table, patch in patches.items():
            if patch.reload is not None:
                raise SnapshotError("reload patches go through load_table")
            if patch.othello_reset is not None:
                fresh = LudoView(self._views[(shard, table)].image())
                fresh.apply(patch)
                self.load_table(shard, table, fresh.image())
        self._begin(shard)
        try:
            for table, patch in patches.items():
                if patch.othello_reset is None:
                    self._views[(shard, table)].apply(patch)
        finally:
            self._end(shard)

    def set_position(self, shard: int, seq: int, epoch: int, ready: bool = True) -> None:
        off = self._layout.shard_offset(shard)
        struct.pack_into("<qqQ", _buf(self._ctl), off + 8, seq, epoch, int(ready))

    def position(self, shard: int) -> tuple[int, int, bool]:
        off = self._layout.shard_offset(shard)
        seq, epoch, ready = struct.unpack_from("<qqQ", _buf(self._ctl), off + 8)
        return seq, epoch, bool(ready)

    def view(self, shard: int, table: int) -> LudoView:
        return self._views[(shard, table)]

    def _reap(self) -> None:
        while len(self._retired) > 2:
            seg = self._retired.pop(0)
            seg.close()
            seg.unlink()

    def close(self) -> None:
        """Unlink every segment (readers keep mappings they already have)."""
        _release_views(self._views, self._counters)
        for seg in [*self._segments.values(), *self._retired]:
            seg.close()
            seg.unlink()
        self._segments.clear()
        self._retired.clear()
        self._ctl.close()
        self._ctl.unlink()


class SharedIndexReader:
    """Attaches to a writer's segments by name and answers consistent lookups."""

    def __init__(self, prefix: str) -> None:
        """Attach to the writer's segments; FileNotFoundError until the writer has
        created and initialised them (callers poll for readiness)."""
        self._ctl = shared_memory.SharedMemory(f"{prefix}-ctl")
        _untrack(self._ctl)
        magic, n_shards, n_tables = _HEAD.unpack_from(_buf(self._ctl), 0)
        if magic == bytes(len(magic)) and n_shards == 0:
            # The writer creates the segment zeroed, then writes its header.
            self._ctl.close()
            raise FileNotFoundError(f"{prefix}-ctl is still being initialised")
        if magic != _MAGIC:
            self._ctl.close()
            raise SnapshotError(f"{prefix}-ctl is not a KVCompass control segment")
        self._layout = _Layout(n_shards, n_tables)
        self.n_shards, self.n_tables = n_shards, n_tables
        self._counters = [
            _buf(self._ctl)[o : o + 8].cast("Q")
            for o in (self._layout.shard_offset(s) for s in range(n_shards))
        ]
        self._names: dict[tuple[int, int], bytes] = {}
        self._segments: dict[tuple[int, int], shared_memory.SharedMemory] = {}
        self._views: dict[tuple[int, int], LudoView] = {}

    def ready(self) -> bool:
        return all(self.position(s)[2] for s in range(self.n_shards))

    def position(self, shard: int) -> tuple[int, int, bool]:
        off = self._layout.shard_offset(shard)
        seq, epoch, ready = struct.unpack_from("<qqQ", _buf(self._ctl), off + 8)
        return seq, epoch, bool(ready)

    def _view(self, shard: int, table: int) -> LudoView:
        _, raw = _TABLE.unpack_from(_buf(self._ctl), self._layout.table_offset(shard, table))
        name = raw.rstrip(b"\0")
        if self._names.get((shard, table)) != name:
            if not name:
                raise SnapshotError(f"shard {shard} table {table} is not loaded yet")
            seg = shared_memory.SharedMemory(name.decode())
            _untrack(seg)
            header = ImageHeader.unpack(_buf(seg))
            view = LudoView.attach(_buf(seg)[: layout_of(header.geometry).view_end])
            old = self._segments.pop((shard, table), None)
            old_view = self._views.pop((shard, table), None)
            if old_view is not None:
                old_view.release()
            if old is not None:
                with contextlib.suppress(BufferError):  # a caller still holds its arrays
                    old.close()
            self._segments[(shard, table)] = seg
            self._views[(shard, table)] = view
            self._names[(shard, table)] = name
        return self._views[(shard, table)]

    def lookup(self, shard: int, table: int, key: int) -> int:
        """The table's value for ``key``, from a state no writer was changing."""
        return self._consistent(shard, lambda: self._view(shard, table).lookup(key))

    def image(self, shard: int, table: int) -> bytes:
        """A consistent copy of a table's view image (for audits and tests)."""
        return self._consistent(shard, lambda: self._view(shard, table).raw_image())

    def _consistent(self, shard: int, read: Callable[[], T]) -> T:
        """Run ``read`` until no writer touched the shard meanwhile (the sequence lock)."""
        counter = self._counters[shard]
        deadline = 0.0
        for attempt in itertools.count():
            if attempt >= _SPINS:
                # The writer holds the shard (a big batch or a table reload): let it
                # run instead of burning the CPU it needs, and give up at a deadline.
                now = time.monotonic()
                if not deadline:
                    deadline = now + _WAIT_LIMIT_S
                elif now > deadline:
                    break
                time.sleep(0)
            before = counter[0]
            if before & 1:
                continue
            try:
                value = read()
            except (OSError, ValueError, IndexError):
                # A segment name or image read while the writer swapped it.
                if counter[0] == before:
                    raise
                continue
            if counter[0] == before:
                return value
        raise TornRead(f"shard {shard}: writer kept the sequence lock busy")

    def close(self) -> None:
        _release_views(self._views, self._counters)
        for seg in self._segments.values():
            with contextlib.suppress(BufferError):  # a caller still holds a view
                seg.close()
        self._segments.clear()
        self._ctl.close()


def _release_views(views: dict[tuple[int, int], LudoView], counters: list[memoryview]) -> None:
    """Drop every array and memoryview over the segments, so they can be closed."""
    for view in views.values():
        view.release()
    views.clear()
    for counter in counters:
        counter.release()
    counters.clear()


def _remove_stale(prefix: str) -> None:
    """Unlink segments a killed writer with the same prefix left behind (Linux /dev/shm)."""
    shm_dir = Path("/dev/shm")
    if not shm_dir.is_dir():  # pragma: no cover - other platforms
        return
    for path in shm_dir.glob(f"{prefix}-*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def default_prefix() -> str:
    """A per-process default segment prefix (tests and single-host runs)."""
    return f"kvc{os.getpid()}"
