"""Types of the compiled XXH3 digests (xxh3.pyx); the docstrings are there."""

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

__all__ = ["digests_at"]

def digests_at(head: bytes, body: object, ends: Iterable[int], mask: int) -> NDArray[np.uint64]: ...
