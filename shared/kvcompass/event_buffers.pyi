"""Types of the compiled event buffers (event_buffers.pyx); the docstrings are there."""

from array import array
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from typing_extensions import disjoint_base

__all__ = ["ShardEventBuffers"]

#: (shard, kinds, tiers, counts, lengths, keys) of one shard's next batch.
_TakenColumns = tuple[
    int,
    NDArray[np.uint8],
    NDArray[np.uint8],
    NDArray[np.uint32],
    NDArray[np.uint32],
    NDArray[np.uint64],
]

@disjoint_base
class ShardEventBuffers:
    @property
    def pending_keys(self) -> int: ...
    @property
    def n_shards(self) -> int: ...
    @property
    def max_events(self) -> int: ...
    def __init__(self, n_shards: int, max_events: int) -> None: ...
    def add(
        self, kind: int, tier: int, lengths: Sequence[int], keys: NDArray[np.uint64] | array[int]
    ) -> bool: ...
    def add_prefixes(
        self, kind: int, tier: int, head: bytes, tokens: object, lengths: Sequence[int]
    ) -> bool: ...
    def add_one(self, kind: int, tier: int, length: int, key: int) -> bool: ...
    def mark_all(self) -> None: ...
    def take(self) -> list[_TakenColumns]: ...
    def discard(self) -> int: ...
