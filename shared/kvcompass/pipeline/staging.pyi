"""Types of the compiled staged writes (staging.pyx); the docstrings are there."""

import numpy as np
from numpy.typing import NDArray
from typing_extensions import disjoint_base

__all__ = ["StagedWrites"]

#: (table id, keys, clear, bits, count) of one table's staged writes (columns by address).
_Taken = tuple[int, int, int, int, int]

@disjoint_base
class StagedWrites:
    def __init__(self, n_tables: int, n_shards: int, shard: int) -> None: ...
    def first_foreign(self, keys: NDArray[np.uint64]) -> int: ...
    def add(
        self,
        table_id: int,
        field: int,
        keys: NDArray[np.uint64],
        tiers: NDArray[np.uint8],
        counts: NDArray[np.uint32],
    ) -> None: ...
    def take(self) -> list[_Taken]: ...
