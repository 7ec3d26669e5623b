"""The edge replayer's side of the shared-memory views: one writer per prefix."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from types import TracebackType

from kvcompass.errors import ConfigError
from kvcompass.index.errors import SnapshotError
from kvcompass.index.image import ImageHeader
from kvcompass.index.patches import TablePatch
from kvcompass.index.view import LudoView
from kvcompass.shm.lifetime import WriterLock
from kvcompass.shm.segments import (
    EPOCH,
    HEAD,
    MAGIC,
    READY,
    SEQ,
    SEQLOCK,
    SHARD_SIZE,
    SHM_DIR,
    TABLE,
    VERSION,
    ControlLayout,
    Segment,
    control_name,
    remove_stale,
    table_name,
    unlink,
)

__all__ = ["SharedIndexWriter", "remove_segments"]


class SharedIndexWriter:
    """Owns the segments; applies patches and reloads under per-shard sequence locks.

    A context manager: leaving it (or :meth:`close`) ends the incarnation for readers,
    then unlinks every segment. A second writer of a live prefix raises PrefixInUse.
    """

    def __init__(self, prefix: str, n_shards: int, n_tables: int) -> None:
        if not SHM_DIR.is_dir():  # pragma: no cover - other platforms
            raise ConfigError(f"shared-memory views need {SHM_DIR} (Linux)")
        self.prefix = prefix
        self.incarnation = 1 + secrets.randbits(62)
        self._layout = ControlLayout(n_shards, n_tables)
        self._lock = WriterLock(prefix, self.incarnation)
        try:
            remove_stale(prefix)
            self._ctl = self._publish_control()
        except BaseException:
            self._lock.close()
            raise
        self._records = [
            self._ctl.buf[o : o + SHARD_SIZE].cast("q")
            for o in map(self._layout.shard_offset, range(n_shards))
        ]
        #: (shard, table) -> its current segment and the view over it.
        self._tables: dict[tuple[int, int], tuple[Segment, LudoView]] = {}
        self._retired: list[Segment] = []
        self._nonce = 0
        self._closed = False

    def _publish_control(self) -> Segment:
        """Fill the control segment under a private name, then rename it into place, so
        a reader never maps a half-written header."""
        layout = self._layout
        ctl = Segment.create(control_name(self.prefix, self.incarnation), layout.size)
        try:
            HEAD.pack_into(
                ctl.buf,
                0,
                MAGIC,
                layout.n_shards,
                layout.n_tables,
                self.incarnation,
                os.getpid(),
            )
            ctl.rename(control_name(self.prefix))
        except BaseException:
            unlink(ctl.name)
            ctl.close()
            raise
        return ctl

    def __enter__(self) -> SharedIndexWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the sequence lock ---------------------------------------------------------

    def _begin(self, shard: int) -> None:
        self._records[shard][SEQLOCK] += 1  # odd: readers retry

    def _end(self, shard: int) -> None:
        self._records[shard][SEQLOCK] += 1  # even again: a consistent state

    # -- writes --------------------------------------------------------------------

    def load_table(self, shard: int, table: int, image: bytes) -> None:
        """Install a table image (bootstrap or reload) in a fresh segment."""
        header = ImageHeader.unpack(image)
        self._nonce += 1
        name = table_name(self.prefix, shard, table, header.geometry.generation, self._nonce)
        seg = Segment.create(name, len(image))
        try:
            seg.buf[: len(image)] = image
            view = LudoView.attach(seg.buf[: len(image)])
        except BaseException:
            seg.close()
            unlink(name)
            raise
        self._begin(shard)
        old = self._tables.get((shard, table))
        self._tables[(shard, table)] = (seg, view)
        TABLE.pack_into(
            self._ctl.buf,
            self._layout.table_offset(shard, table),
            header.geometry.generation,
            name.encode(),
        )
        # After the name: a reader that sees the new version also sees the new name.
        self._records[shard][VERSION] += 1
        self._end(shard)
        if old is not None:
            # Readers still mapping the old segment keep a valid mapping after unlink.
            old_seg, old_view = old
            old_view.release()
            self._retired.append(old_seg)
            self._reap()

    def apply(self, shard: int, patches: Mapping[int, TablePatch]) -> None:
        """Apply one batch of table patches to a shard atomically for readers."""
        # A new Othello seed changes the image header, which attached readers cached:
        # such a table moves to a new segment, as a reload does.
        for table, patch in patches.items():
            if patch.reload is not None:
                raise SnapshotError("reload patches go through load_table")
            if patch.othello_reset is not None:
                fresh = LudoView(self.view(shard, table).image())
                fresh.apply(patch)
                self.load_table(shard, table, fresh.image())
        self._begin(shard)
        try:
            for table, patch in patches.items():
                if patch.othello_reset is None:
                    self.view(shard, table).apply(patch)
        finally:
            self._end(shard)

    def set_position(self, shard: int, seq: int, epoch: int, ready: bool = True) -> None:
        record = self._records[shard]
        self._begin(shard)
        record[SEQ], record[EPOCH], record[READY] = seq, epoch, int(ready)
        self._end(shard)

    def position(self, shard: int) -> tuple[int, int, bool]:
        record = self._records[shard]
        return record[SEQ], record[EPOCH], bool(record[READY])

    def view(self, shard: int, table: int) -> LudoView:
        return self._tables[(shard, table)][1]

    def _reap(self) -> None:
        while len(self._retired) > 2:
            seg = self._retired.pop(0)
            seg.close()
            unlink(seg.name)

    def close(self) -> None:
        """End the incarnation (readers report not-ready), then unlink every segment;
        readers keep mappings they already have. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._lock.end_incarnation()
        for record in self._records:
            record.release()
        self._records.clear()
        for _, view in self._tables.values():
            view.release()
        for seg in [*(seg for seg, _ in self._tables.values()), *self._retired]:
            seg.close()
            unlink(seg.name)
        self._tables.clear()
        self._retired.clear()
        self._ctl.close()
        unlink(self._ctl.name)
        self._lock.close()  # last: no new writer removes segments while we still do


def remove_segments(prefix: str) -> None:
    """Unlink every segment a dead writer of ``prefix`` left (a killed edge's, when no
    successor will take the prefix over). PrefixInUse while a writer of it lives."""
    lock = WriterLock(prefix, incarnation=1)
    try:
        remove_stale(prefix)
    finally:
        lock.close()
