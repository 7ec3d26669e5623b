"""Patches: absolute state that brings a keyless view to its maintenance table's state.

A patch never says "flip" or "add"; it says "bucket 17 now has seed 3 and these four
cells", "Othello word 9 is now this", or "here is the whole table". Applying one twice is
harmless and a later patch always wins, so a view that replays the patch stream in order
converges to the maintenance state whatever duplicates it saw.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BucketImage", "OthelloReset", "TablePatch"]


@dataclass(frozen=True, slots=True)
class BucketImage:
    """The complete view state of one bucket: its seed and its four cells."""

    bucket: int
    seed: int
    cells: tuple[int, int, int, int]
    fingerprints: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class OthelloReset:
    """A rebuilt locator: its new hash seed and every word of its bit array."""

    othello_seed: int
    words: bytes


@dataclass(frozen=True, slots=True)
class TablePatch:
    """Everything one table changed since the previous patch, as final state.

    ``reload`` (a full view image) replaces the table, including its generation; when
    present nothing else is needed. Otherwise ``othello_reset`` applies first, then
    ``words`` as (index, value) pairs, then ``buckets``; all target ``generation``.
    """

    generation: int
    buckets: tuple[BucketImage, ...] = ()
    words: tuple[tuple[int, int], ...] = ()
    othello_reset: OthelloReset | None = None
    reload: bytes | None = None

    @property
    def is_empty(self) -> bool:
        return (
            not self.buckets
            and not self.words
            and self.othello_reset is None
            and self.reload is None
        )
