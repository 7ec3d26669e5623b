"""Bucket seed search: the smallest seed that sends a bucket's keys to distinct cells.

Slot hashes are laid out so one 64-bit hash word of a key gives its 2-bit cell for 32
consecutive seeds. Two keys collide under seed s exactly when their words agree on bit
pair s, so one XOR per key pair tests 32 seeds at once: a 4-key bucket (about 10.7 seeds
to try on average) costs 4 hashes and a few dozen integer operations, scalar or vectorised.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kvcompass.index import kernel
from kvcompass.index.errors import TableFull
from kvcompass.index.geometry import SEEDS_PER_WORD, TableGeometry

__all__ = ["MAX_SEED", "find_seed", "find_seeds_array"]

MAX_SEED = 255
_LOW_BITS = 0x5555555555555555  # bit 0 of every 2-bit field
_U1 = np.uint64(1)
_ULOW = np.uint64(_LOW_BITS)
_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))


def find_seed(
    g: TableGeometry, keys: list[int], words0: list[int] | None = None
) -> tuple[int, list[int]]:
    """The smallest seed under which ``keys`` (at most 4) occupy distinct cells.

    ``words0``, when given, are the keys' slot-hash words 0 (saves hashing for the
    ~96% of buckets that find a seed below 32). Returns the seed and each key's cell.
    Raises TableFull when no 8-bit seed works (probability about 1e-11 for four keys).
    The search itself is the write kernel's (:func:`kvcompass.index.kernel.find_seed`).
    """
    n = len(keys)
    if n > 4:
        raise ValueError(f"a bucket holds at most 4 keys, got {n}")
    padded = np.zeros(4, dtype=np.int64)
    padded[:n] = keys
    sigs = np.zeros(4, dtype=np.uint64)
    sigs[:n] = words0 if words0 is not None else [g.slot_word(k, 0) for k in keys]
    slots = np.zeros(4, dtype=np.int64)
    seed = kernel.find_seed(kernel.geometry_vector(g), padded, sigs, n, slots)
    if seed < 0:
        raise TableFull(f"no bucket seed separates {n} keys")
    return int(seed), slots[:n].tolist()


def find_seeds_array(
    g: TableGeometry, keys: NDArray[np.uint64], occupied: NDArray[np.bool_]
) -> tuple[NDArray[np.uint8], NDArray[np.uint64]]:
    """Vectorised :func:`find_seed` over many buckets.

    ``keys`` and ``occupied`` have shape (buckets, 4). Returns every bucket's seed and
    every key's cell under it (cells of unoccupied entries are meaningless).
    """
    n_buckets = keys.shape[0]
    seeds = np.zeros(n_buckets, dtype=np.uint8)
    cells = np.zeros(keys.shape, dtype=np.uint64)
    todo = np.arange(n_buckets)
    for word in range((MAX_SEED + 1) // SEEDS_PER_WORD):
        if len(todo) == 0:
            break
        sub_keys = keys[todo]
        sub_occ = occupied[todo]
        sigs = g.slot_words_array(sub_keys.reshape(-1), word).reshape(sub_keys.shape)
        collide = np.zeros(len(todo), dtype=np.uint64)
        for i, j in _PAIRS:
            x = sigs[:, i] ^ sigs[:, j]
            hit = ~(x | (x >> _U1)) & _ULOW
            hit[~(sub_occ[:, i] & sub_occ[:, j])] = 0
            collide |= hit
        valid = ~collide & _ULOW
        found = valid != 0
        v = valid[found]
        bit = np.bitwise_count((v & (~v + _U1)) - _U1).astype(np.uint64)
        done = todo[found]
        seeds[done] = (word * SEEDS_PER_WORD + (bit >> _U1)).astype(np.uint8)
        cells[done] = (sigs[found] >> bit[:, None]) & np.uint64(3)
        todo = todo[~found]
    if len(todo):
        raise TableFull(f"no bucket seed separates the keys of {len(todo)} buckets")
    return seeds, cells
