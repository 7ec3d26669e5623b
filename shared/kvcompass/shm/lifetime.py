"""Who writes a shared-memory prefix, and whether that writer still lives, told by the kernel.

The writer holds two open-file-description locks on ``<prefix>.lock``: byte 0 keeps a
second writer of the prefix out, byte ``incarnation`` (a random number ≥ 1 stamped in
the control header) says "this incarnation lives". The kernel drops both when the writer
closes the file or dies, even by SIGKILL, so a reader's one ``F_OFD_GETLK`` on that byte
tells whether the writer it attached to is still there. A clean close removes the lock
file; a killed writer's stays for its successor to lock and remove. Open-file-description locks also
conflict within one process, so a reader beside its writer gets the same answer. (A
process forked from the writer shares its locks: the edge replayer does not fork.)
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path
from typing import Final

from kvcompass.errors import ConfigError
from kvcompass.shm.segments import HEAD, MAGIC, SHM_DIR, Segment, control_name

__all__ = ["LivenessProbe", "PrefixInUse", "WriterLock"]

#: struct flock on 64-bit Linux: type, whence, start, len, pid (and padding).
_FLOCK: Final = struct.Struct("hhqqi4x")
_EXCLUSIVE_BYTE: Final = 0  # locked by the prefix's one writer; incarnations lock bytes >= 1


class PrefixInUse(ConfigError):
    """Another live writer owns this shared-memory prefix."""


def _lock_path(prefix: str) -> Path:
    # Not a "<prefix>-" name: stale-segment removal never touches it.
    return SHM_DIR / f"{prefix}.lock"


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _flock(kind: int, start: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, start, 1, 0)


class WriterLock:
    """A writer's hold on its prefix and on its incarnation's liveness byte."""

    def __init__(self, prefix: str, incarnation: int) -> None:
        self._path = path = _lock_path(prefix)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise ConfigError(f"cannot open the writer lock {path}: {exc.strerror}") from exc
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, _EXCLUSIVE_BYTE))
            except BlockingIOError:
                os.close(fd)
                raise PrefixInUse(
                    f"shared-memory prefix {prefix!r} is in use by a live writer{_holder(prefix)}"
                ) from None
            if os.fstat(fd).st_ino == _inode(path):
                break
            os.close(fd)  # a closing writer unlinked the file after we opened it: retry
        self._fd = fd
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, incarnation))
        self._incarnation = incarnation

    def end_incarnation(self) -> None:
        """Readers see this writer gone from now on (it still holds the prefix)."""
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, self._incarnation))

    def close(self) -> None:
        """Remove the lock file, then release the prefix. A writer that opened the file
        meanwhile finds it unlinked once it gets the lock, and starts over."""
        os.unlink(self._path)
        os.close(self._fd)


class LivenessProbe:
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
    """' (pid N)' from the prefix's control segment, when it names one."""
    try:
        ctl = Segment.open(control_name(prefix))
    except (OSError, ValueError):  # absent, or empty
        return ""
    try:
        if len(ctl.buf) < HEAD.size:
            return ""
        magic, _, _, _, pid = HEAD.unpack_from(ctl.buf, 0)
        return f" (pid {pid})" if magic == MAGIC else ""
    finally:
        ctl.close()
