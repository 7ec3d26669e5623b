"""Cache belief b_r (paper §3.4): how much of a worker's claimed match it really reuses.

The index stores no keys, so a lookup can name a worker that does not hold the prefix
(a false locator) or no longer does (an evict still in flight). Each response reports the
tokens the worker actually reused; the edge keeps an EWMA of reused / claimed per worker
and discounts that worker's future matches by it (b·m in the score).
"""

from __future__ import annotations

__all__ = ["CacheBelief"]


class CacheBelief:
    """Per worker b ∈ [0, 1], starting at 1 (trust the index until a response disagrees).

    ``values`` is the live list the scorer reads (index = global worker index).
    """

    def __init__(self, n_workers: int, weight: float) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"belief weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.values = [1.0] * n_workers

    def update(self, worker: int, claimed_tokens: int, reused_tokens: int) -> None:
        """Fold one response in. Only a claim is evidence: claimed 0 leaves b unchanged.

        A worker may reuse more than claimed (its match lies between two indexed lengths,
        and the index credits only the shorter), so the ratio is capped at 1.
        """
        if claimed_tokens <= 0:
            return
        ratio = min(1.0, max(0, reused_tokens) / claimed_tokens)
        b = self.values[worker]
        self.values[worker] = b + self.weight * (ratio - b)

    def __getitem__(self, worker: int) -> float:
        return self.values[worker]
