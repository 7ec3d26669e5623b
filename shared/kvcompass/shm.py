"""Edge views in shared memory: one writer (the replayer), many lock-free readers.

Segments are files in ``/dev/shm`` (POSIX shared memory, Linux): a control segment
``<prefix>-ctl`` plus one segment per table generation holding that table's view image
(:mod:`kvcompass.index.image`). The control segment has a header naming the writer
(a random incarnation and its pid), then per shard a sequence lock counter, the last
applied patch seq, the epoch, a ready flag and a table-segments version, then per table
its generation and the name of its current segment.

Readers never lock. They read the shard's counter, look up, and read it again: an odd or
changed counter means the writer was mid-batch, so they retry (a sequence lock). A table
that grew lives in a new segment; the writer publishes its name and bumps the shard's
segments version under the same sequence lock, and readers re-attach. This relies on the
writer's stores becoming visible in order, which x86-64 guarantees.

Writer lifetime is told by the kernel, not by Python's resource tracker (never involved
here: a dead writer's segments stay until the next writer with the prefix removes them).
The writer holds two open-file-description locks on ``<prefix>.lock``: byte 0 excludes a
second writer of the prefix, byte ``incarnation`` says "this incarnation lives". The
kernel drops both when the writer closes or dies, even by SIGKILL. Before every answer a
reader asks the kernel whether its writer's byte is still locked (one ``fcntl``); if not,
it re-attaches to a new writer's control segment by name, or reports not-ready.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import mmap
import os
import re
import secrets
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, TypeVar

from kvcompass.errors import ConfigError
from kvcompass.index.discovery import Match, MatchDecoder, MultiLevelQuery
from kvcompass.index.errors import SnapshotError
from kvcompass.index.image import ImageHeader, layout_of
from kvcompass.index.layout import IndexLayout
from kvcompass.index.patches import TablePatch
from kvcompass.index.reader import IndexNotReady
from kvcompass.index.view import LudoView
from kvcompass.keys import shard_of

__all__ = ["PrefixInUse", "SharedIndexReader", "SharedIndexWriter", "TornRead"]

T = TypeVar("T")

SHM_DIR: Final = Path("/dev/shm")
_MAGIC = b"KVCSHM02"
_HEAD = struct.Struct("<8sIIQQ")  # magic, shards, tables, incarnation, writer pid
_SHARD_FIELDS = 5  # int64 each: seqlock, applied seq, epoch, ready, segments version
_SEQLOCK, _SEQ, _EPOCH, _READY, _VERSION = range(_SHARD_FIELDS)
_SHARD_SIZE = 8 * _SHARD_FIELDS
_TABLE = struct.Struct("<Q56s")  # generation, segment name
_SPINS = 64  # busy retries before yielding the CPU to the writer
_WAIT_LIMIT_S = 5.0  # a reader gives up (TornRead) after the writer held a shard this long
#: struct flock on 64-bit Linux: type, whence, start, len, pid (and padding).
_FLOCK = struct.Struct("hhqqi4x")
_EXCLUSIVE_BYTE = 0  # locked by the prefix's one writer; incarnations lock bytes >= 1


class TornRead(IndexNotReady):
    """A reader could not get a consistent read: the writer held the shard too long."""


class PrefixInUse(ConfigError):
    """Another live writer owns this shared-memory prefix."""


@dataclass(frozen=True)
class _ControlLayout:
    """Byte offsets in the control segment."""

    n_shards: int
    n_tables: int

    @property
    def size(self) -> int:
        return _HEAD.size + self.n_shards * (_SHARD_SIZE + self.n_tables * _TABLE.size)

    def shard_offset(self, shard: int) -> int:
        return _HEAD.size + shard * _SHARD_SIZE

    def table_offset(self, shard: int, table: int) -> int:
        tables = _HEAD.size + self.n_shards * _SHARD_SIZE
        return tables + (shard * self.n_tables + table) * _TABLE.size


# -- segments and the writer's lock file ---------------------------------------------------


class _Segment:
    """One named shared-memory file, mapped (read-only for readers)."""

    def __init__(self, name: str, fd: int, writable: bool) -> None:
        self.name = name
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self._map = mmap.mmap(fd, 0, prot=prot)
        finally:
            os.close(fd)
        self.buf = memoryview(self._map)

    @classmethod
    def create(cls, name: str, size: int) -> _Segment:
        fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)  # a fresh file reads as zeros
        except BaseException:
            os.close(fd)
            os.unlink(SHM_DIR / name)
            raise
        return cls(name, fd, writable=True)

    @classmethod
    def open(cls, name: str) -> _Segment:
        return cls(name, os.open(SHM_DIR / name, os.O_RDONLY), writable=False)

    def rename(self, name: str) -> None:
        os.rename(SHM_DIR / self.name, SHM_DIR / name)
        self.name = name

    def close(self) -> None:
        """Unmap; BufferError while a caller still holds arrays over it."""
        self.buf.release()
        self._map.close()


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SHM_DIR / name)


def _lock_path(prefix: str) -> Path:
    # Not a "<prefix>-" name: stale-segment removal never touches it, and it is never
    # unlinked, so every writer and reader of the prefix locks the same inode.
    return SHM_DIR / f"{prefix}.lock"


def _flock(kind: int, start: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, start, 1, 0)


class _WriterLock:
    """A writer's hold on its prefix (byte 0) and its incarnation's liveness byte."""

    def __init__(self, prefix: str, incarnation: int) -> None:
        path = _lock_path(prefix)
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot open the writer lock {path}: {exc.strerror}") from exc
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, _EXCLUSIVE_BYTE))
        except BlockingIOError:
            os.close(self._fd)
            raise PrefixInUse(
                f"shared-memory prefix {prefix!r} is in use by a live writer{_holder(prefix)}"
            ) from None
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, incarnation))
        self._incarnation = incarnation

    def end_incarnation(self) -> None:
        """Readers see this writer gone from now on (it still holds the prefix)."""
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, self._incarnation))

    def close(self) -> None:
        os.close(self._fd)


class _LivenessProbe:
    """Asks the kernel whether one writer incarnation still holds its byte."""

    def __init__(self, prefix: str, incarnation: int) -> None:
        self._request = _flock(fcntl.F_WRLCK, incarnation)
        try:
            self._fd: int | None = os.open(_lock_path(prefix), os.O_RDONLY)
        except FileNotFoundError:
            self._fd = None  # no lock file: no writer ever held this incarnation here

    def alive(self) -> bool:
        if self._fd is None:
            return False
        answer = fcntl.fcntl(self._fd, fcntl.F_OFD_GETLK, self._request)
        kind: int = _FLOCK.unpack(answer)[0]
        return kind != fcntl.F_UNLCK

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder(prefix: str) -> str:
    """ " (pid N)" from the prefix's control segment, when it names one."""
    try:
        ctl = _Segment.open(f"{prefix}-ctl")
    except OSError:
        return ""
    try:
        magic, _, _, _, pid = _HEAD.unpack_from(ctl.buf, 0)
        return f" (pid {pid})" if magic == _MAGIC else ""
    finally:
        ctl.close()


def _stale_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r"-(ctl(-[0-9a-f]+)?|s\d+t\d+g\d+n\d+)")


def _remove_stale(prefix: str) -> None:
    """Unlink segments a dead writer of the prefix left (call only holding its lock)."""
    pattern = _stale_pattern(prefix)
    for name in os.listdir(SHM_DIR):
        if pattern.fullmatch(name):
            _unlink(name)


# -- the writer ---------------------------------------------------------------------------


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
        self._layout = _ControlLayout(n_shards, n_tables)
        self._lock = _WriterLock(prefix, self.incarnation)
        try:
            _remove_stale(prefix)
            self._ctl = self._publish_control()
        except BaseException:
            self._lock.close()
            raise
        self._records = [
            self._ctl.buf[o : o + _SHARD_SIZE].cast("q")
            for o in map(self._layout.shard_offset, range(n_shards))
        ]
        self._segments: dict[tuple[int, int], _Segment] = {}
        self._views: dict[tuple[int, int], LudoView] = {}
        self._retired: list[_Segment] = []
        self._nonce = 0
        self._closed = False

    def _publish_control(self) -> _Segment:
        """Fill the control segment under a private name, then rename it into place, so
        a reader never maps a half-written header."""
        layout = self._layout
        ctl = _Segment.create(f"{self.prefix}-ctl-{self.incarnation:x}", layout.size)
        try:
            _HEAD.pack_into(
                ctl.buf,
                0,
                _MAGIC,
                layout.n_shards,
                layout.n_tables,
                self.incarnation,
                os.getpid(),
            )
            ctl.rename(f"{self.prefix}-ctl")
        except BaseException:
            _unlink(ctl.name)
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
        self._records[shard][_SEQLOCK] += 1  # odd: readers retry

    def _end(self, shard: int) -> None:
        self._records[shard][_SEQLOCK] += 1  # even again: a consistent state

    # -- writes --------------------------------------------------------------------

    def load_table(self, shard: int, table: int, image: bytes) -> None:
        """Install a table image (bootstrap or reload) in a fresh segment."""
        header = ImageHeader.unpack(image)
        self._nonce += 1
        name = f"{self.prefix}-s{shard}t{table}g{header.geometry.generation}n{self._nonce}"
        seg = _Segment.create(name, len(image))
        seg.buf[: len(image)] = image
        view = LudoView.attach(seg.buf[: len(image)])
        self._begin(shard)
        old = self._segments.get((shard, table))
        old_view = self._views.get((shard, table))
        self._segments[(shard, table)] = seg
        self._views[(shard, table)] = view
        _TABLE.pack_into(
            self._ctl.buf,
            self._layout.table_offset(shard, table),
            header.geometry.generation,
            name.encode(),
        )
        # After the name: a reader that sees the new version also sees the new name.
        self._records[shard][_VERSION] += 1
        self._end(shard)
        if old is not None and old_view is not None:
            # Readers still mapping the old segment keep a valid mapping after unlink.
            old_view.release()
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
        record = self._records[shard]
        self._begin(shard)
        record[_SEQ], record[_EPOCH], record[_READY] = seq, epoch, int(ready)
        self._end(shard)

    def position(self, shard: int) -> tuple[int, int, bool]:
        record = self._records[shard]
        return record[_SEQ], record[_EPOCH], bool(record[_READY])

    def view(self, shard: int, table: int) -> LudoView:
        return self._views[(shard, table)]

    def _reap(self) -> None:
        while len(self._retired) > 2:
            seg = self._retired.pop(0)
            seg.close()
            _unlink(seg.name)

    def close(self) -> None:
        """End the incarnation (readers report not-ready), then unlink every segment;
        readers keep mappings they already have. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._lock.end_incarnation()
        for view in self._views.values():
            view.release()
        self._views.clear()
        for record in self._records:
            record.release()
        self._records.clear()
        for seg in [*self._segments.values(), *self._retired]:
            seg.close()
            _unlink(seg.name)
        self._segments.clear()
        self._retired.clear()
        self._ctl.close()
        _unlink(self._ctl.name)
        self._lock.close()  # last: no new writer removes segments while we still do


# -- readers ------------------------------------------------------------------------------


def _not_mapped(key: int) -> int:
    raise IndexNotReady("table not mapped yet")  # replaced by the view's lookup on refresh


class _Attachment:
    """One writer incarnation's segments, as one reader maps them."""

    def __init__(self, prefix: str, wait_limit_s: float) -> None:
        """FileNotFoundError while no control segment is published under ``prefix``."""
        self._ctl = _Segment.open(f"{prefix}-ctl")
        try:
            self._read_header(prefix)
        except BaseException:
            self._ctl.close()
            raise
        self._probe = _LivenessProbe(prefix, self.incarnation)
        self._wait_limit_s = wait_limit_s
        self._records = [
            self._ctl.buf[o : o + _SHARD_SIZE].cast("q")
            for o in map(self._ctl_layout.shard_offset, range(self.n_shards))
        ]
        self._versions = [-1] * self.n_shards
        self._names: dict[tuple[int, int], bytes] = {}
        self._segments: dict[tuple[int, int], _Segment] = {}
        self._views: dict[tuple[int, int], LudoView] = {}
        self._lookups: list[list[Callable[[int], int]]] = [
            [_not_mapped] * self.n_tables for _ in range(self.n_shards)
        ]

    def _read_header(self, prefix: str) -> None:
        if len(self._ctl.buf) < _HEAD.size:
            raise FileNotFoundError(f"{prefix}-ctl is still being initialised")
        magic, n_shards, n_tables, incarnation, pid = _HEAD.unpack_from(self._ctl.buf, 0)
        if magic == bytes(len(magic)) and n_shards == 0:
            raise FileNotFoundError(f"{prefix}-ctl is still being initialised")
        if magic != _MAGIC:
            raise SnapshotError(f"{prefix}-ctl is not a KVCompass control segment")
        self._ctl_layout = _ControlLayout(n_shards, n_tables)
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
            shard, lambda: (record[_SEQ], record[_EPOCH], record[_READY])
        )
        return seq, epoch, bool(ready)

    def last_position(self, shard: int) -> tuple[int, int]:
        """(seq, epoch) as a dead writer left them (no sequence lock: it may be odd)."""
        record = self._records[shard]
        return record[_SEQ], record[_EPOCH]

    def shard_ready(self, shard: int) -> bool:
        return bool(self._records[shard][_READY])

    def _refresh(self, shard: int) -> None:
        """Map the shard's current table segments (call inside a read section)."""
        version = self._records[shard][_VERSION]  # before the names: see load_table
        for table in range(self.n_tables):
            offset = self._ctl_layout.table_offset(shard, table)
            name = _TABLE.unpack_from(self._ctl.buf, offset)[1].rstrip(b"\0")
            if self._names.get((shard, table)) == name:
                continue
            if not name:
                raise IndexNotReady(f"shard {shard} table {table} is not loaded yet")
            seg = _Segment.open(name.decode())
            header = ImageHeader.unpack(seg.buf)
            view = LudoView.attach(seg.buf[: layout_of(header.geometry).view_end])
            self._drop_table(shard, table)
            self._segments[(shard, table)] = seg
            self._views[(shard, table)] = view
            self._names[(shard, table)] = name
            self._lookups[shard][table] = view.lookup
        self._versions[shard] = version

    def _drop_table(self, shard: int, table: int) -> None:
        self._lookups[shard][table] = _not_mapped
        self._names.pop((shard, table), None)
        view = self._views.pop((shard, table), None)
        if view is not None:
            view.release()
        seg = self._segments.pop((shard, table), None)
        if seg is not None:
            with contextlib.suppress(BufferError):  # a caller still holds its arrays
                seg.close()

    def _tables(self, shard: int) -> list[Callable[[int], int]]:
        if self._records[shard][_VERSION] != self._versions[shard]:
            self._refresh(shard)
        return self._lookups[shard]

    def lookup_many(self, shard: int, probes: list[tuple[int, int]]) -> list[int]:
        """Values of (table, key) probes of one shard, all from one consistent state."""

        def read() -> list[int]:
            lookups = self._tables(shard)
            return [lookups[table](key) for table, key in probes]

        return self.consistent(shard, read)

    def view(self, shard: int, table: int) -> LudoView:
        """The table's view, mapped (call inside a read section)."""
        self._tables(shard)
        return self._views[(shard, table)]

    def consistent(self, shard: int, read: Callable[[], T]) -> T:
        """Run ``read`` until no writer touched the shard meanwhile (the sequence lock)."""
        record = self._records[shard]
        deadline = 0.0
        for attempt in itertools.count():
            if attempt >= _SPINS:
                # The writer holds the shard (a big batch or a table reload): let it
                # run instead of burning the CPU it needs, and give up at a deadline.
                if not self.alive():
                    raise IndexNotReady(f"shard {shard}: the writer died mid-write")
                now = time.monotonic()
                if not deadline:
                    deadline = now + self._wait_limit_s
                elif now > deadline:
                    break
                time.sleep(0)
            before = record[_SEQLOCK]
            if before & 1:
                continue
            try:
                value = read()
            except (OSError, ValueError, IndexError, IndexNotReady):
                # A segment name or image read while the writer swapped it: retry,
                # unless nothing changed meanwhile (then the error is real).
                if record[_SEQLOCK] == before:
                    raise
                continue
            if record[_SEQLOCK] == before:
                return value
        raise TornRead(f"shard {shard}: writer kept the sequence lock busy")

    def close(self) -> None:
        for shard, table in list(self._views):
            self._drop_table(shard, table)
        for record in self._records:
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
    ) -> None:
        """Attach to the writer's segments; FileNotFoundError until a writer has
        published them (callers poll for readiness)."""
        self.prefix = prefix
        self._layout = layout
        self._decoder = None if layout is None else MatchDecoder(layout)
        self._wait_limit_s = wait_limit_s
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
            return self._att
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
        self._att.close()
        self._att = self._checked(fresh)
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

    def match(self, query: MultiLevelQuery) -> Match:
        """Longest matched length and tier of every worker, one read section per shard."""
        if self._decoder is None:
            raise ConfigError("SharedIndexReader needs the index layout to match queries")
        att = self._live()
        n_shards = att.n_shards
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for probe in self._decoder.probes(query):
            by_shard.setdefault(shard_of(probe[1], n_shards), []).append(probe)
        values: dict[tuple[int, int], int] = {}
        for shard, probes in by_shard.items():
            if not att.shard_ready(shard):
                raise IndexNotReady(f"shard {shard} is not ready")
            values.update(zip(probes, att.lookup_many(shard, probes), strict=True))
        return self._decoder.decode(query, lambda table, key: values[(table, key)])

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
