"""Buffered random draws for generators that take one value at a time.

A numpy call per value costs about a microsecond; drawing a few thousand at once and
handing them out from a Python list costs tens of nanoseconds each.

Token ids are the costly part. Prompts are ``array('I')`` (:data:`TOKEN_TYPECODE`):
native uint32, which a consumer reads as a numpy array without a conversion per token
(turning a list of Python ints into one costs ~9 ns per token, 30 µs for a Mixed prompt,
and Python ints from numpy ~50-100 ns each). Every token a generator emits is a slice of
one fixed pool of 2M random ids (made once per process and vocabulary), taken at a
seeded random offset: a slice is one copy of bytes. Two slices at different offsets are
different texts (their first 16 ids agree with probability vocab^-16); two fresh
messages in the same context coincide only if their offsets do (1 in 2M per pair, as
real users sometimes type the same message).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from array import array
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "POOL_TOKENS",
    "TOKEN_TYPECODE",
    "Draws",
    "Zipf",
    "lognormal_params",
    "token_array",
    "token_pool",
]

_BLOCK = 4096
POOL_TOKENS = 1 << 21
#: The array typecode of a prompt's token ids: unsigned 32-bit ("I" is 4 bytes wherever
#: this runs; the keys module checks the same for its own fast path).
TOKEN_TYPECODE = "I"


def token_array(ids: NDArray[np.integer[Any]]) -> array[int]:
    """Token ids from numpy as a prompt (each must be below 2^32)."""
    tokens = array(TOKEN_TYPECODE)
    tokens.frombytes(np.ascontiguousarray(ids, dtype=np.uint32).tobytes())
    return tokens


@functools.cache
def token_pool(vocab: int) -> array[int]:
    """The fixed pool of random token ids in [0, vocab) every generated text is cut from."""
    rng = np.random.default_rng([0x9001, vocab])
    return token_array(rng.integers(0, vocab, POOL_TOKENS, dtype=np.uint32))


class Draws:
    """One seeded stream of uniforms, standard normals and token ids (one sequence per
    seed: the same calls in the same order give the same values)."""

    def __init__(self, seed: int, stream: int, vocab: int) -> None:
        self._rng = np.random.default_rng([seed, stream])
        self.vocab = vocab
        self._u: list[float] = []
        self._z: list[float] = []
        self._pool = token_pool(vocab)

    def uniform(self) -> float:
        """A number in [0, 1)."""
        if not self._u:
            self._u = self._rng.random(_BLOCK).tolist()
        return self._u.pop()

    def normal(self) -> float:
        if not self._z:
            self._z = self._rng.standard_normal(_BLOCK).tolist()
        return self._z.pop()

    def tokens(self, n: int) -> array[int]:
        """``n`` fresh token ids in [0, vocab): the pool at a random offset."""
        if n > POOL_TOKENS:
            return self.tokens(POOL_TOKENS) + self.tokens(n - POOL_TOKENS)
        at = self.below(POOL_TOKENS - n + 1)
        return self._pool[at : at + n]

    def below(self, n: int) -> int:
        """An integer in [0, n)."""
        return min(int(self.uniform() * n), n - 1)

    def chance(self, p: float) -> bool:
        return self.uniform() < p

    def lognormal(self, mean: float, cv: float, lo: int, hi: int) -> int:
        """An integer from a lognormal of this mean and coefficient of variation, clipped
        to [lo, hi] (clipping moves the mean a little; the tests measure the result)."""
        mu, sigma = lognormal_params(mean, cv)
        return min(hi, max(lo, round(math.exp(mu + sigma * self.normal()))))

    def geometric(self, mean: float) -> int:
        """A count >= 1 of this mean (geometric: each further turn with prob 1 - 1/mean)."""
        if mean <= 1.0:
            return 1
        return 1 + int(math.log1p(-self.uniform()) / math.log1p(-1.0 / mean))

    def exponential(self, mean: float) -> float:
        return -mean * math.log1p(-self.uniform())


@functools.cache
def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and coefficient of variation."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


class Zipf:
    """Item popularity ∝ rank^-s over ``n`` items (rank 1 = item 0); s = 0 is uniform."""

    def __init__(self, n: int, s: float) -> None:
        if n < 1:
            raise ValueError("a Zipf popularity needs at least one item")
        weights = np.arange(1, n + 1, dtype=np.float64) ** -s
        total = float(weights.sum())
        self._cumulative = list(itertools.accumulate((weights / total).tolist()))

    def pick(self, u: float) -> int:
        """The item at cumulative share ``u`` ∈ [0, 1)."""
        return min(bisect.bisect_right(self._cumulative, u), len(self._cumulative) - 1)
