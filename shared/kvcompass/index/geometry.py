"""Table geometry: every number a Ludo view and its maintenance copy must agree on.

A view answers exactly like its maintenance table only if both use the same bucket count,
Othello sizes, hash seeds, value width and fingerprint width. ``TableGeometry`` holds them,
derives all the hash positions of a key (scalar and vectorised, bit-identical), and is
the header that snapshots carry and views verify.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from kvcompass.hashing import GOLDEN64, MASK32, MASK64, mix64, mix64_array

__all__ = ["DEFAULT_LOAD_LIMIT", "SEEDS_PER_WORD", "TableGeometry"]

#: Keys per slot above which a table grows (paper and Ludo: 95% occupancy).
DEFAULT_LOAD_LIMIT = 0.95
#: One 64-bit slot-hash word gives 2-bit slots for 32 consecutive bucket seeds.
SEEDS_PER_WORD = 32
#: Othello A side is 4/3 of the B side (Othello's sizing; 2.33 cells per key).
_OTHELLO_A_RATIO = 4 / 3

_U32 = np.uint64(32)
_UMASK32 = np.uint64(MASK32)
_U3 = np.uint64(3)
_U5 = np.uint64(5)
_U31 = np.uint64(31)
_U1 = np.uint64(1)
_UGOLDEN = np.uint64(GOLDEN64)


@dataclass(frozen=True, slots=True)
class TableGeometry:
    """Sizes and hash seeds of one Ludo table generation.

    ``nb`` buckets of four cells; the Othello locator has ``ma`` A cells followed by
    ``mb`` B cells. ``capacity`` is the most keys the generation holds before it grows.
    """

    nb: int
    ma: int
    mb: int
    capacity: int
    value_bits: int
    fingerprint_bits: int
    generation: int
    bucket_seed: int
    othello_seed: int
    slot_seed: int
    fingerprint_seed: int

    def __post_init__(self) -> None:
        if self.value_bits not in (32, 64):
            raise ValueError(f"value_bits must be 32 or 64, got {self.value_bits}")
        if not 0 <= self.fingerprint_bits <= 16:
            raise ValueError(f"fingerprint_bits must be in 0..16, got {self.fingerprint_bits}")
        # ma + mb < 2^31: node ids are int32, and (32-bit hash · ma or mb) must fit a
        # uint64 so the vectorised node positions equal the scalar ones.
        if not 1 <= self.nb < 2**31 or self.ma < 1 or self.mb < 1 or self.ma + self.mb >= 2**31:
            raise ValueError(f"bad table sizes nb={self.nb} ma={self.ma} mb={self.mb}")
        if not 0 <= self.capacity <= min(4 * self.nb, self.mb):
            raise ValueError(f"capacity {self.capacity} exceeds table or locator size")

    @classmethod
    def for_capacity(
        cls,
        capacity: int,
        *,
        value_bits: int = 32,
        fingerprint_bits: int = 0,
        load_limit: float = DEFAULT_LOAD_LIMIT,
        generation: int = 0,
        rng: random.Random | None = None,
    ) -> TableGeometry:
        """The smallest geometry that holds ``capacity`` keys at ``load_limit`` occupancy."""
        if not 0 < load_limit <= 0.98:
            raise ValueError(f"load_limit must be in (0, 0.98], got {load_limit}")
        rng = rng or random.Random()
        capacity = max(capacity, 8)
        nb = math.ceil(capacity / (4 * load_limit))
        capacity = math.floor(4 * nb * load_limit)
        mb = capacity
        ma = math.ceil(mb * _OTHELLO_A_RATIO)
        return cls(
            nb=nb,
            ma=ma,
            mb=mb,
            capacity=capacity,
            value_bits=value_bits,
            fingerprint_bits=fingerprint_bits,
            generation=generation,
            bucket_seed=rng.getrandbits(64),
            othello_seed=rng.getrandbits(64),
            slot_seed=rng.getrandbits(64),
            fingerprint_seed=rng.getrandbits(64),
        )

    # -- derived sizes -------------------------------------------------------------

    @property
    def n_cells(self) -> int:
        return 4 * self.nb

    @property
    def n_nodes(self) -> int:
        """Othello cells (graph nodes): A side then B side."""
        return self.ma + self.mb

    @property
    def n_words(self) -> int:
        """64-bit words holding the Othello bits."""
        return (self.n_nodes + 63) // 64

    @property
    def value_mask(self) -> int:
        return (1 << self.value_bits) - 1

    @property
    def workers_per_value(self) -> int:
        """2-bit tier fields one value holds."""
        return self.value_bits // 2

    def with_othello_seed(self, seed: int) -> TableGeometry:
        return replace(self, othello_seed=seed)

    # -- scalar hashes (maintenance side and scalar lookups) ---------------------------

    def buckets(self, key: int) -> tuple[int, int]:
        """The two candidate buckets of a key."""
        h = mix64(key ^ self.bucket_seed)
        return ((h & MASK32) * self.nb) >> 32, ((h >> 32) * self.nb) >> 32

    def nodes(self, key: int) -> tuple[int, int]:
        """The key's Othello edge: an A-side node and a B-side node."""
        h = mix64(key ^ self.othello_seed)
        return ((h & MASK32) * self.ma) >> 32, self.ma + (((h >> 32) * self.mb) >> 32)

    def slot_word(self, key: int, word: int) -> int:
        """Slot-hash word ``word``: bits 2s..2s+1 are the key's slot under seed 32·word+s."""
        return mix64(key ^ self.slot_seed ^ ((word * GOLDEN64) & MASK64))

    def slot(self, key: int, seed: int) -> int:
        """Cell (0..3) of the key inside a bucket whose seed is ``seed``."""
        return (self.slot_word(key, seed >> 5) >> ((seed & 31) << 1)) & 3

    def fingerprint(self, key: int) -> int:
        if not self.fingerprint_bits:
            return 0
        return mix64(key ^ self.fingerprint_seed) >> (64 - self.fingerprint_bits)

    # -- vectorised hashes (views and bulk builds) ---------------------------------

    def buckets_array(
        self, keys: NDArray[np.uint64]
    ) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        h = mix64_array(keys ^ np.uint64(self.bucket_seed))
        nb = np.uint64(self.nb)
        return ((h & _UMASK32) * nb) >> _U32, ((h >> _U32) * nb) >> _U32

    def nodes_array(
        self, keys: NDArray[np.uint64]
    ) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        h = mix64_array(keys ^ np.uint64(self.othello_seed))
        ia = ((h & _UMASK32) * np.uint64(self.ma)) >> _U32
        ib = (((h >> _U32) * np.uint64(self.mb)) >> _U32) + np.uint64(self.ma)
        return ia, ib

    def slot_words_array(self, keys: NDArray[np.uint64], word: int) -> NDArray[np.uint64]:
        salt = np.uint64(self.slot_seed ^ ((word * GOLDEN64) & MASK64))
        return mix64_array(keys ^ salt)

    def slots_array(self, keys: NDArray[np.uint64], seeds: NDArray[np.uint8]) -> NDArray[np.uint64]:
        """Cell of every key under its bucket's seed (``seeds`` aligned with ``keys``)."""
        s = seeds.astype(np.uint64)
        x = keys ^ np.uint64(self.slot_seed)
        x ^= (s >> _U5) * _UGOLDEN
        mix64_array(x, out=x)
        x >>= (s & _U31) << _U1
        x &= _U3
        return x

    def fingerprints_array(self, keys: NDArray[np.uint64]) -> NDArray[np.uint64]:
        if not self.fingerprint_bits:
            return np.zeros(keys.shape, dtype=np.uint64)
        h = mix64_array(keys ^ np.uint64(self.fingerprint_seed))
        return h >> np.uint64(64 - self.fingerprint_bits)
