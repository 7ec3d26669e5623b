"""The 64-bit mixing function every KVCompass hash derives from, scalar and vectorised.

Keys are already uniform 63-bit digests, so the index only needs a fast, seedable
bijection that decorrelates its several uses of one key (shard, bucket pair, Othello
cells, in-bucket slot, fingerprint). MurmurHash3's 64-bit finaliser is that bijection.
The scalar form works on Python ints, the array form on ``uint64`` arrays, the compiled
form inside numba code (the index's write and match kernels, the shard of a key array);
all three return bit-identical results, which the maintenance side (scalar) and the
lookup view (vectorised) depend on. numba cannot call a function on unbounded Python ints.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

__all__ = [
    "GOLDEN64",
    "MASK32",
    "MASK63",
    "MASK64",
    "mix64",
    "mix64_array",
    "mix64_compiled",
]

MASK32 = (1 << 32) - 1
MASK63 = (1 << 63) - 1
MASK64 = (1 << 64) - 1
#: 2^64 / golden ratio: spreads small integers (seeds, salts) over all 64 bits.
GOLDEN64 = 0x9E3779B97F4A7C15

_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_U33 = np.uint64(33)
_UC1 = np.uint64(_C1)
_UC2 = np.uint64(_C2)


def mix64(x: int) -> int:
    """MurmurHash3 fmix64 of a 64-bit Python int."""
    x ^= x >> 33
    x = (x * _C1) & MASK64
    x ^= x >> 33
    x = (x * _C2) & MASK64
    return x ^ (x >> 33)


def mix64_array(
    x: NDArray[np.uint64],
    out: NDArray[np.uint64] | None = None,
    scratch: NDArray[np.uint64] | None = None,
) -> NDArray[np.uint64]:
    """Vectorised :func:`mix64`; writes into ``out`` (which may be ``x``) when given.

    ``scratch``, an array of the same shape, saves allocating a temporary (hot loops).
    """
    if out is None:
        out = x.copy()
    elif out is not x:
        np.copyto(out, x)
    tmp = np.right_shift(out, _U33, out=scratch)
    out ^= tmp
    out *= _UC1
    np.right_shift(out, _U33, out=tmp)
    out ^= tmp
    out *= _UC2
    np.right_shift(out, _U33, out=tmp)
    out ^= tmp
    return out


@numba.njit(cache=True, nogil=True)
def mix64_compiled(x: np.uint64) -> np.uint64:
    """:func:`mix64` in compiled code, where uint64 arithmetic wraps."""
    x ^= x >> _U33
    x *= _UC1
    x ^= x >> _U33
    x *= _UC2
    return x ^ (x >> _U33)
