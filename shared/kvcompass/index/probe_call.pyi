"""Types of the compiled match call (probe_call.pyx); the docstrings are there."""

from array import array

import numpy as np
from numpy.typing import NDArray

__all__ = ["N_COLUMNS", "match"]

N_COLUMNS: int

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
