"""Types of the compiled match call (probe_call.pyx); the docstrings are there."""

from array import array

import numpy as np
from numpy.typing import NDArray
from typing_extensions import disjoint_base

__all__ = ["N_COLUMNS", "MatchTarget", "match", "match_at"]

N_COLUMNS: int

@disjoint_base
class MatchTarget:
    def __init__(
        self,
        desc: NDArray[np.uint64],
        n_tables: int,
        workers: NDArray[np.int64],
        lengths: NDArray[np.int64],
        tiers: NDArray[np.int64],
        touched: NDArray[np.uint8],
    ) -> None: ...
    def lists(self) -> tuple[list[int], list[int]]: ...

def match_at(
    target: MatchTarget,
    keys: NDArray[np.int64] | NDArray[np.uint64] | array[int],
    probes: NDArray[np.int64],
) -> None: ...
def match(
    desc: NDArray[np.uint64],
    n_tables: int,
    keys: NDArray[np.int64] | NDArray[np.uint64] | array[int],
    probes: NDArray[np.int64],
    workers: NDArray[np.int64],
    lengths: NDArray[np.int64],
    tiers: NDArray[np.int64],
    touched: NDArray[np.uint8],
) -> None: ...
