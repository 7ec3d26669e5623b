"""Patches: absolute state that brings a keyless view to its maintenance table's state.

A patch never says "flip" or "add"; it says "bucket 17 now has seed 3 and these four
cells", "Othello word 9 is now this", or "here is the whole table". Applying one twice is
harmless and a later patch always wins, so a view that replays the patch stream in order
converges to the maintenance state whatever duplicates it saw. Bucket and word images are
held as arrays (struct of arrays) so producing, applying and encoding them is vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["BucketImages", "OthelloReset", "TablePatch", "WordImages"]

_NO_INDEX = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class BucketImages:
    """Complete view state of some buckets: seed and four cells (and fingerprints) each."""

    buckets: NDArray[np.int64]
    seeds: NDArray[np.uint8]
    cells: NDArray[Any]  # (n, 4) uint32 or uint64
    fingerprints: NDArray[Any] | None = None  # (n, 4) uint8 or uint16, when the table has them

    def __len__(self) -> int:
        return len(self.buckets)


@dataclass(frozen=True, slots=True, eq=False)
class WordImages:
    """New values of some 64-bit words of the Othello bit array."""

    indices: NDArray[np.int64] = field(default_factory=lambda: _NO_INDEX)
    values: NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, slots=True, eq=False)
class OthelloReset:
    """A rebuilt locator: its new hash seed and every word of its bit array."""

    othello_seed: int
    words: bytes


@dataclass(frozen=True, slots=True, eq=False)
class TablePatch:
    """Everything one table changed since the previous patch, as final state.

    ``reload`` (a full view image) replaces the table, including its generation; when
    present nothing else is needed. Otherwise ``othello_reset`` applies first, then
    ``words``, then ``buckets``; all target ``generation``.
    """

    generation: int
    buckets: BucketImages | None = None
    words: WordImages = field(default_factory=WordImages)
    othello_reset: OthelloReset | None = None
    reload: bytes | None = None

    @property
    def is_empty(self) -> bool:
        return (
            (self.buckets is None or len(self.buckets) == 0)
            and len(self.words) == 0
            and self.othello_reset is None
            and self.reload is None
        )
