"""The routers' side of the shared-memory views: lock-free readers that follow writer
restarts and never answer from a dead writer."""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from array import array
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final, TypeVar

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import ConfigError
from kvcompass.index import probe, probe_call
from kvcompass.index.discovery import Match, MatchProbes, MultiLevelQuery
from kvcompass.index.errors import SnapshotError
from kvcompass.index.image import ImageHeader, layout_of
from kvcompass.index.layout import IndexLayout
from kvcompass.index.reader import IndexNotReady
from kvcompass.index.view import LudoView
from kvcompass.shm.lifetime import LivenessProbe
from kvcompass.shm.segments import (
    EPOCH,
    HEAD,
    MAGIC,
    READY,
    SEQ,
    SEQLOCK,
    SHARD_SIZE,
    TABLE,
    VERSION,
    ControlLayout,
    Segment,
    control_name,
)

__all__ = ["SharedIndexReader", "TornRead"]

T = TypeVar("T")

_SPINS: Final = 64  # busy retries before yielding the CPU to the writer
_WAIT_LIMIT_S: Final = 5.0  # a reader gives up (TornRead) after the writer held a shard this long
#: How long :meth:`SharedIndexReader.match` trusts the kernel's last "the writer lives"
#: (one fcntl call, a third to a half of the match's own cost when asked per request).
#: A writer killed within it may still answer: its last state, at most this much older
#: than a live writer's would be, far less than an update's trip from the MUs.
LIVENESS_TTL_S: Final = 0.002


class TornRead(IndexNotReady):
    """A reader could not get a consistent read: the writer held the shard too long."""


def _not_mapped(key: int) -> int:
    """Stands for a table's lookup until a refresh maps the table (which always precedes
    the first lookup of a shard: versions start unequal)."""
    raise IndexNotReady("table not mapped yet")


class _Attachment:
    """One writer incarnation's segments, as one reader maps them."""

    def __init__(self, prefix: str, wait_limit_s: float) -> None:
        """FileNotFoundError while no control segment is published under ``prefix``."""
        name = control_name(prefix)
        try:
            self._ctl = Segment.open(name)
        except ValueError:  # mmap refuses an empty file: not something a writer publishes
            raise SnapshotError(f"{name} is empty, not a KVCompass control segment") from None
        try:
            self._read_header(prefix)
        except BaseException:
            self._ctl.close()
            raise
        self._probe = LivenessProbe(prefix, self.incarnation)
        self._wait_limit_s = wait_limit_s
        self._records = [
            self._ctl.buf[o : o + SHARD_SIZE].cast("q")
            for o in map(self._ctl_layout.shard_offset, range(self.n_shards))
        ]
        # The records are contiguous: one field of every shard is a strided view, read
        # by one tolist() in C (shard order, as the read section needs).
        start = self._ctl_layout.shard_offset(0)
        every = self._ctl.buf[start : start + self.n_shards * SHARD_SIZE].cast("q")
        fields = len(every) // self.n_shards
        self._columns = [every[f::fields] for f in (SEQLOCK, READY, VERSION)]
        self._seqlocks, self._readies, self._shard_versions = self._columns
        every.release()
        self._versions = [-1] * self.n_shards
        self._names: dict[tuple[int, int], bytes] = {}
        self._segments: dict[tuple[int, int], Segment] = {}
        self._views: dict[tuple[int, int], LudoView] = {}
        self._lookups: list[list[Callable[[int], int]]] = [
            [_not_mapped] * self.n_tables for _ in range(self.n_shards)
        ]
        #: Per (shard, table) row: where the mapped table's arrays are (see probe.py).
        self._desc = np.zeros((self.n_shards * self.n_tables, probe.N_COLUMNS), np.uint64)
        self._touched = np.zeros(self.n_shards, np.uint8)

    def _read_header(self, prefix: str) -> None:
        if len(self._ctl.buf) < HEAD.size:
            raise FileNotFoundError(f"{prefix}-ctl is still being initialised")
        magic, n_shards, n_tables, incarnation, pid = HEAD.unpack_from(self._ctl.buf, 0)
        if magic == bytes(len(magic)) and n_shards == 0:
            raise FileNotFoundError(f"{prefix}-ctl is still being initialised")
        if magic != MAGIC:
            raise SnapshotError(f"{prefix}-ctl is not a KVCompass control segment")
        self._ctl_layout = ControlLayout(n_shards, n_tables)
        if len(self._ctl.buf) < self._ctl_layout.size:
            raise SnapshotError(f"{prefix}-ctl is shorter than its header says")
        self.n_shards: int = n_shards
        self.n_tables: int = n_tables
        self.incarnation: int = incarnation
        self.pid: int = pid

    def alive(self) -> bool:
        return self._probe.alive()

    def position(self, shard: int) -> tuple[int, int, bool]:
        record = self._records[shard]
        seq, epoch, ready = self.consistent(
            shard, lambda: (record[SEQ], record[EPOCH], record[READY])
        )
        return seq, epoch, bool(ready)

    def last_position(self, shard: int) -> tuple[int, int]:
        """(seq, epoch) as a dead writer left them (no sequence lock: it may be odd)."""
        record = self._records[shard]
        return record[SEQ], record[EPOCH]

    def shard_ready(self, shard: int) -> bool:
        return bool(self._records[shard][READY])

    def _refresh(self, shard: int) -> None:
        """Map the shard's current table segments (call inside a read section)."""
        version = self._records[shard][VERSION]  # before the names: see load_table
        for table in range(self.n_tables):
            offset = self._ctl_layout.table_offset(shard, table)
            name = TABLE.unpack_from(self._ctl.buf, offset)[1].rstrip(b"\0")
            if self._names.get((shard, table)) == name:
                continue
            if not name:
                raise IndexNotReady(f"shard {shard} table {table} is not loaded yet")
            seg = Segment.open(name.decode())
            header = ImageHeader.unpack(seg.buf)
            layout = layout_of(header.geometry)
            view = LudoView.attach(seg.buf[: layout.view_end])
            self._drop_table(shard, table)
            self._segments[(shard, table)] = seg
            self._views[(shard, table)] = view
            self._names[(shard, table)] = name
            self._lookups[shard][table] = view.lookup
            base = np.frombuffer(seg.buf, np.uint8, 1).ctypes.data
            probe.describe(self._desc[shard * self.n_tables + table], base, header.geometry, layout)
        self._versions[shard] = version

    def _drop_table(self, shard: int, table: int) -> None:
        self._lookups[shard][table] = _not_mapped
        self._desc[shard * self.n_tables + table] = 0
        self._names.pop((shard, table), None)
        view = self._views.pop((shard, table), None)
        if view is not None:
            view.release()
        seg = self._segments.pop((shard, table), None)
        if seg is not None:
            with contextlib.suppress(BufferError):  # a caller still holds its arrays
                seg.close()

    def _tables(self, shard: int) -> list[Callable[[int], int]]:
        if self._records[shard][VERSION] != self._versions[shard]:
            self._refresh(shard)
        return self._lookups[shard]

    def lookup_many(self, shard: int, probes: list[tuple[int, int]]) -> list[int]:
        """Values of (table, key) probes of one shard, all from one consistent state."""

        def read() -> list[int]:
            lookups = self._tables(shard)
            return [lookups[table](key) for table, key in probes]

        return self.consistent(shard, read)

    def match_probes(
        self,
        keys: array[int] | NDArray[np.int64],
        probes: NDArray[np.int64],
        workers: NDArray[np.int64],
        out: tuple[NDArray[np.int64], NDArray[np.int64]],
        stale_ok: bool = False,
    ) -> None:
        """Run :func:`probe.match_probes` in one read section over every shard (a
        section costs a few loads per shard; one compiled call beats one per shard)."""
        lengths, tiers = out
        # The common case inline: no writer in any shard, every table mapped and current.
        # Anything else takes the general read section, which retries and waits.
        before = self._seqlocks.tolist()
        for lock in before:
            if lock & 1:
                self._stable_match(keys, probes, workers, out)
                break
        else:
            if self._shard_versions.tolist() == self._versions:
                probe_call.match(
                    self._desc, self.n_tables, keys, probes, workers, lengths, tiers, self._touched
                )
                if self._seqlocks.tolist() != before:
                    self._stable_match(keys, probes, workers, out)
            else:
                self._stable_match(keys, probes, workers, out)
        if stale_ok:
            return
        readies = self._readies.tolist()
        if 0 in readies:
            for shard, ready in enumerate(readies):
                if not ready and self._touched[shard]:
                    raise IndexNotReady(f"shard {shard} is not ready")

    def _stable_match(
        self,
        keys: array[int] | NDArray[np.int64],
        probes: NDArray[np.int64],
        workers: NDArray[np.int64],
        out: tuple[NDArray[np.int64], NDArray[np.int64]],
    ) -> None:
        lengths, tiers = out
        touched, records, versions = self._touched, self._records, self._versions

        def read() -> None:
            for shard, record in enumerate(records):
                if record[VERSION] != versions[shard]:
                    self._refresh(shard)  # every descriptor row current
            probe_call.match(
                self._desc, self.n_tables, keys, probes, workers, lengths, tiers, touched
            )

        self._stable(range(self.n_shards), read)

    def view(self, shard: int, table: int) -> LudoView:
        """The table's view, mapped (call inside a read section)."""
        self._tables(shard)
        return self._views[(shard, table)]

    def consistent(self, shard: int, read: Callable[[], T]) -> T:
        """Run ``read`` until no writer touched the shard meanwhile (the sequence lock)."""
        return self._stable((shard,), read)

    def _stable(self, shards: Sequence[int], read: Callable[[], T]) -> T:
        """Run ``read`` until no writer touched any of ``shards`` meanwhile."""
        every = len(shards) == self.n_shards
        records = self._records if every else [self._records[s] for s in shards]
        where = "every shard" if every else f"shard {', '.join(map(str, shards))}"
        deadline = 0.0
        for attempt in itertools.count():
            if attempt >= _SPINS:
                # The writer holds the shard (a big batch or a table reload): let it
                # run instead of burning the CPU it needs, and give up at a deadline.
                if not self.alive():
                    raise IndexNotReady(f"{where}: the writer died mid-write")
                now = time.monotonic()
                if not deadline:
                    deadline = now + self._wait_limit_s
                elif now > deadline:
                    break
                time.sleep(0)
            before = [record[SEQLOCK] for record in records]
            if any(lock & 1 for lock in before):
                continue
            try:
                value = read()
            except (OSError, ValueError, IndexError, IndexNotReady) as exc:
                # A segment name or image read while the writer swapped it: retry,
                # unless nothing changed meanwhile (then the error is real, or the
                # writer closed and unlinked its segments since this call began).
                if [record[SEQLOCK] for record in records] != before:
                    continue
                if not self.alive():
                    raise IndexNotReady(f"{where}: the writer is gone") from exc
                raise
            if [record[SEQLOCK] for record in records] == before:
                return value
        busy = ", ".join(str(s) for s, r in zip(shards, records, strict=True) if r[SEQLOCK] & 1)
        raise TornRead(f"{f'shard {busy}' if busy else where}: writer kept the sequence lock busy")

    def close(self) -> None:
        for shard, table in list(self._views):
            self._drop_table(shard, table)
        for record in (*self._records, *self._columns):
            record.release()
        self._records.clear()
        self._probe.close()
        self._ctl.close()


class SharedIndexReader:
    """Attaches to a writer's segments by name and answers consistent lookups.

    With the index ``layout`` it is an :class:`~kvcompass.index.reader.IndexReader`:
    :meth:`match` answers a whole query, one read section per shard. Every answer comes
    from a live writer: after the writer closed or died, calls raise IndexNotReady (a
    Transient) until a new writer of the prefix is up, then answer from it. Use one
    reader per thread.
    """

    def __init__(
        self,
        prefix: str,
        layout: IndexLayout | None = None,
        *,
        wait_limit_s: float = _WAIT_LIMIT_S,
        liveness_ttl_s: float = LIVENESS_TTL_S,
    ) -> None:
        """Attach to the writer's segments; FileNotFoundError until a writer has
        published them (callers poll for readiness). ``liveness_ttl_s``: see
        :meth:`match`."""
        self.prefix = prefix
        self._layout = layout
        self._wait_limit_s = wait_limit_s
        self._liveness_ttl_s = liveness_ttl_s
        #: Until this monotonic time match() trusts the last answer "the writer lives".
        self._alive_until = -math.inf
        if layout is not None:
            self._probes = MatchProbes(layout)
            self._lengths = np.zeros(layout.n_workers, np.int64)
            self._tiers = np.zeros(layout.n_workers, np.int64)
            probe.warm_up()
        self._att = self._checked(_Attachment(prefix, wait_limit_s))

    def _checked(self, att: _Attachment) -> _Attachment:
        if self._layout is not None and len(self._layout.tables) != att.n_tables:
            att.close()
            raise ConfigError(
                f"shared-memory prefix {self.prefix!r} holds {att.n_tables} tables per shard, "
                f"the reader's layout has {len(self._layout.tables)}"
            )
        return att

    @property
    def n_shards(self) -> int:
        return self._att.n_shards

    @property
    def n_tables(self) -> int:
        return self._att.n_tables

    def _live(self) -> _Attachment:
        """The attachment of a live writer, re-attaching after a restart."""
        if self._att.alive():
            self._alive_until = time.monotonic() + self._liveness_ttl_s
            return self._att
        self._alive_until = -math.inf
        try:
            fresh = _Attachment(self.prefix, self._wait_limit_s)
        except FileNotFoundError:
            fresh = None
        if fresh is None or fresh.incarnation == self._att.incarnation or not fresh.alive():
            if fresh is not None:
                fresh.close()
            raise IndexNotReady(
                f"shared-memory prefix {self.prefix!r}: writer pid {self._att.pid} "
                "is gone and no new writer is up"
            )
        self._checked(fresh)
        self._att.close()
        self._att = fresh
        self._alive_until = time.monotonic() + self._liveness_ttl_s
        return fresh

    def ready(self) -> bool:
        """A live writer, and every shard loaded and caught up."""
        try:
            att = self._live()
        except IndexNotReady:
            return False
        return all(att.shard_ready(s) for s in range(att.n_shards))

    def position(self, shard: int) -> tuple[int, int, bool]:
        """(last applied seq, epoch, ready) of a shard; ready is False without a live
        writer."""
        try:
            att = self._live()
        except IndexNotReady:
            return (*self._att.last_position(shard), False)
        return att.position(shard)

    def match(self, query: MultiLevelQuery, *, stale_ok: bool = False) -> Match:
        """Longest matched length and tier of every worker: every probe in one compiled
        call, in one read section over all shards (the answers of the in-process
        :class:`~kvcompass.index.discovery.DiscoveryView`, which a unit test checks).

        IndexNotReady if a shard the query touches is not ready, and, as at start-up,
        while any shard has a table not loaded yet. ``stale_ok`` answers from shards
        marked not ready too (their last loaded state, e.g. while the edge has lost the
        broker): still one consistent read of a live writer's tables. The writer's
        liveness is asked of the kernel at most once per ``liveness_ttl_s`` (and again at
        once after any other call found the writer gone): a writer that died within that
        time may still answer with its last state. ``ready``, ``position``, ``lookup``
        and ``image`` always ask."""
        if self._layout is None:
            raise ConfigError("SharedIndexReader needs the index layout to match queries")
        att = self._att if time.monotonic() < self._alive_until else self._live()
        att.match_probes(
            *self._probes.rows(query),
            self._probes.workers,
            (self._lengths, self._tiers),
            stale_ok,
        )
        return Match(self._lengths.tolist(), self._tiers.tolist())

    def lookup(self, shard: int, table: int, key: int) -> int:
        """The table's value for ``key``, from a state no writer was changing."""
        return self._live().lookup_many(shard, [(table, key)])[0]

    def image(self, shard: int, table: int) -> bytes:
        """A consistent copy of a table's view image (for audits and tests)."""
        att = self._live()
        return att.consistent(shard, lambda: att.view(shard, table).raw_image())

    def close(self) -> None:
        self._att.close()

    def __enter__(self) -> SharedIndexReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
