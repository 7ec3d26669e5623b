"""Errors raised by the discovery index."""

from __future__ import annotations

__all__ = ["GenerationMismatch", "KVCIndexError", "SnapshotError", "TableFull"]


class KVCIndexError(Exception):
    """Root of the index's errors ."""


class SnapshotError(KVCIndexError, ValueError):
    """A snapshot or image is corrupt, truncated, or of another table shape."""


class GenerationMismatch(KVCIndexError):
    """A patch targets another table generation; the view must reload from a snapshot."""


class TableFull(KVCIndexError):
    """No cuckoo path of the allowed length frees a cell (the caller grows the table)."""
