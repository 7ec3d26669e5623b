"""Errors raised by the discovery index."""

from __future__ import annotations

__all__ = ["GenerationMismatch", "IndexError_", "SnapshotError", "TableFull"]


class IndexError_(Exception):
    """Root of the index's errors (trailing underscore: not the builtin IndexError)."""


class SnapshotError(IndexError_, ValueError):
    """A snapshot or image is corrupt, truncated, or of another table shape."""


class GenerationMismatch(IndexError_):
    """A patch targets another table generation; the view must reload from a snapshot."""


class TableFull(IndexError_):
    """No cuckoo path of the allowed length frees a cell (the caller grows the table)."""
