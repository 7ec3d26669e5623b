"""Shared content a workload draws from: tenants' system prompts, tool sets, documents,
problem statements, popular chat openers. Each item is a slice of the token pool
(``draws.token_pool``) at its own offset, all offsets distinct, drawn with the lengths
for the whole catalog at once from the catalog's own seed stream."""

from __future__ import annotations

from array import array

import numpy as np

from kvcompass.loadgen.workloads.draws import POOL_TOKENS, lognormal_params, token_pool

__all__ = ["MAX_ITEMS", "MAX_ITEM_TOKENS", "Catalog"]

#: The longest item a catalog holds, and the most items: items are slices of the token
#: pool at distinct offsets.
MAX_ITEM_TOKENS = POOL_TOKENS // 2
MAX_ITEMS = POOL_TOKENS // 2


class Catalog:
    """``size`` items of one kind; item lengths lognormal (``mean``, ``cv``) in [lo, hi]."""

    def __init__(
        self, seed: int, kind: int, size: int, length: tuple[float, float, int, int], vocab: int
    ) -> None:
        mean, cv, lo, hi = length
        if (
            not 1 <= size <= MAX_ITEMS
            or not 1 <= lo <= hi <= MAX_ITEM_TOKENS
            or mean <= 0
            or cv < 0
        ):
            raise ValueError(f"bad catalog: size {size}, length {length}")
        rng = np.random.default_rng([seed, kind])
        mu, sigma = lognormal_params(mean, cv)
        lengths = np.clip(np.rint(rng.lognormal(mu, sigma, size)), lo, hi).astype(np.int64)
        starts = rng.choice(POOL_TOKENS - hi + 1, size, replace=False)
        self.size = size
        self._spans = list(zip(starts.tolist(), (starts + lengths).tolist(), strict=True))
        self._pool = token_pool(vocab)

    def item(self, i: int) -> array[int]:
        """Item ``i``'s tokens (a new array)."""
        start, end = self._spans[i]
        return self._pool[start:end]
