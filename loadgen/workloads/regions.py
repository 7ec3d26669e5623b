"""Which region a session comes from: population shares over the topology's regions."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from kvcompass.loadgen.workloads.keyed import keyed_uniform
from kvcompass.topology import Topology

__all__ = ["RegionShares"]


class RegionShares:
    """Regions with population weights; a session's region is fixed by a keyed draw."""

    def __init__(self, regions: Sequence[str], weights: Sequence[float]) -> None:
        if len(regions) != len(weights) or not regions:
            raise ValueError(f"{len(weights)} weights for regions {list(regions)}")
        # Written so that NaN fails; an infinite weight would make every share NaN or 0.
        if not all(0 <= w < math.inf for w in weights) or not sum(weights) > 0:
            raise ValueError(
                f"region weights must be finite, >= 0 and with a positive sum: {weights}"
            )
        self.regions = tuple(regions)
        total = float(sum(weights))
        self.shares = tuple(w / total for w in weights)
        self._cumulative = list(itertools.accumulate(self.shares))

    @classmethod
    def of(cls, topology: Topology, weights: Sequence[float] = ()) -> RegionShares:
        """``weights`` in topology region order; empty = each region's worker count (every
        region gets load in proportion to its capacity)."""
        names = [r.name for r in topology.regions]
        return cls(names, weights or [len(r.workers) for r in topology.regions])

    def pick(self, u: float) -> str:
        """The region at cumulative share ``u`` ∈ [0, 1)."""
        i = bisect.bisect_right(self._cumulative, u)
        return self.regions[min(i, len(self.regions) - 1)]

    def of_session(self, key: int, session: int) -> str:
        return self.pick(keyed_uniform(key, session))
