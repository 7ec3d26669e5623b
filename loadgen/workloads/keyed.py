"""Keyed, order-free pseudo-randomness: the same inputs give the same numbers whatever
else a workload generated before, so subsets and replays agree (splitmix64 finaliser)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["block_tokens", "keyed_uniform", "mix64"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1


def mix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser, elementwise (wrapping uint64 arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _seeded(key: int, value: int) -> NDArray[np.uint64]:
    return mix64(np.array([key & _MASK], dtype=np.uint64)) ^ np.array(
        [value & _MASK], dtype=np.uint64
    )


def keyed_uniform(key: int, value: int) -> float:
    """A number in [0, 1) fixed by (key, value)."""
    return float(mix64(_seeded(key, value))[0] >> np.uint64(11)) / float(1 << 53)


def block_tokens(key: int, block_ids: Sequence[int], size: int, vocab: int) -> NDArray[np.uint32]:
    """The token ids of trace blocks ``block_ids``, ``size`` per block, concatenated: a
    keyed hash of (block id, position), so equal block ids give equal tokens."""
    ids = np.asarray(block_ids, dtype=np.uint64).reshape(-1, 1)
    base = mix64(mix64(np.array([key & _MASK], dtype=np.uint64)) ^ ids)
    positions = np.arange(size, dtype=np.uint64) << np.uint64(40)
    return (mix64(base ^ positions) % np.uint64(vocab)).astype(np.uint32).reshape(-1)
