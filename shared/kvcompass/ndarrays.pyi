"""Types of the compiled arrays over memory (ndarrays.pyx); the docstrings are there."""

from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["array_at", "buffer_fields"]

def array_at(
    owner: bytes | bytearray, offset: int, dtype: np.dtype[Any], rows: int, width: int = 0
) -> NDArray[Any]: ...
def buffer_fields(
    obj: object, writable: bool = False
) -> tuple[int, int, str, bool, int, tuple[int, ...], tuple[int, ...], bool]: ...
