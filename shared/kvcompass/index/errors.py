"""Errors raised by the discovery index, rooted in :mod:`kvcompass.errors`."""

from __future__ import annotations

from kvcompass.errors import BadInput, InvariantBroken, KVCError

__all__ = ["GenerationMismatch", "IndexCorrupt", "KVCIndexError", "SnapshotError", "TableFull"]


class KVCIndexError(KVCError):
    """Root of the index's errors."""


class SnapshotError(KVCIndexError, BadInput):
    """A snapshot or image is corrupt, truncated, or of another table, shard or layout."""


class GenerationMismatch(KVCIndexError):
    """A patch targets another table generation; the view must reload from a snapshot."""


class TableFull(KVCIndexError):
    """No cuckoo path of the allowed length frees a cell (the caller grows the table)."""


class IndexCorrupt(KVCIndexError, InvariantBroken):
    """A write stopped halfway through a move: the table must never be persisted.

    The table refuses every later write, patch and snapshot; its owner crashes and the
    next one restores the last good snapshot.
    """
