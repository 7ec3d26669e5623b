"""Types of the compiled region pairs (region_pairs.pyx); the docstrings are there."""

from array import array

import numpy as np
from numpy.typing import NDArray

__all__ = ["region_pairs"]

def region_pairs(
    planned: tuple[tuple[int, int], ...], keys: array[int] | NDArray[np.uint64]
) -> list[tuple[int, int]]: ...
