"""Named shared-memory files, their names, and the control segment's byte layout.

Segments are files in ``/dev/shm`` (POSIX shared memory, Linux), mapped with ``mmap``
(read-only by readers). Python's ``SharedMemory`` is not used: its resource tracker
would unlink a writer's segments when the writer (or even a reader) dies, while their
lifetime belongs to the writer and its successor.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "HEAD",
    "MAGIC",
    "SHARD_SIZE",
    "SHM_DIR",
    "TABLE",
    "ControlLayout",
    "Segment",
    "control_name",
    "remove_stale",
    "table_name",
    "unlink",
]

SHM_DIR: Final = Path("/dev/shm")
MAGIC: Final = b"KVCSHM02"
HEAD: Final = struct.Struct("<8sIIQQ")  # magic, shards, tables, incarnation, writer pid
#: Per shard, int64 fields: seqlock, last applied seq, epoch, ready, segments version.
SEQLOCK, SEQ, EPOCH, READY, VERSION = range(5)
SHARD_SIZE: Final = 8 * 5
TABLE: Final = struct.Struct("<Q56s")  # generation, segment name


@dataclass(frozen=True)
class ControlLayout:
    """Byte offsets in the control segment: header, shard records, table records."""

    n_shards: int
    n_tables: int

    @property
    def size(self) -> int:
        return HEAD.size + self.n_shards * (SHARD_SIZE + self.n_tables * TABLE.size)

    def shard_offset(self, shard: int) -> int:
        return HEAD.size + shard * SHARD_SIZE

    def table_offset(self, shard: int, table: int) -> int:
        tables = HEAD.size + self.n_shards * SHARD_SIZE
        return tables + (shard * self.n_tables + table) * TABLE.size


def control_name(prefix: str, incarnation: int | None = None) -> str:
    """The control segment's name; with an incarnation, the private name it is filled
    under before the rename that publishes it."""
    return f"{prefix}-ctl" if incarnation is None else f"{prefix}-ctl-{incarnation:x}"


def table_name(prefix: str, shard: int, table: int, generation: int, nonce: int) -> str:
    return f"{prefix}-s{shard}t{table}g{generation}n{nonce}"


def _names_of(prefix: str) -> re.Pattern[str]:
    """Exactly the names above: prefix "a" never matches prefix "a-s0t0g0n1"'s segments."""
    return re.compile(re.escape(prefix) + r"-(ctl(-[0-9a-f]+)?|s\d+t\d+g\d+n\d+)")


def remove_stale(prefix: str) -> None:
    """Unlink segments a dead writer of the prefix left (only while holding its lock)."""
    pattern = _names_of(prefix)
    for name in os.listdir(SHM_DIR):
        if pattern.fullmatch(name):
            unlink(name)


def unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SHM_DIR / name)


class Segment:
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
    def create(cls, name: str, size: int) -> Segment:
        fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)  # a fresh file reads as zeros
        except BaseException:
            os.close(fd)
            unlink(name)
            raise
        return cls(name, fd, writable=True)

    @classmethod
    def open(cls, name: str) -> Segment:
        return cls(name, os.open(SHM_DIR / name, os.O_RDONLY), writable=False)

    def rename(self, name: str) -> None:
        """Atomically (re)place the file under ``name``."""
        os.rename(SHM_DIR / self.name, SHM_DIR / name)
        self.name = name

    def close(self) -> None:
        """Unmap; BufferError while a caller still holds arrays over it."""
        self.buf.release()
        self._map.close()
