"""What the worker's prefix cache takes and returns: its eviction policies, the held
prefix of a prompt, and the changes it reports to the index (plain Python values; the
cache itself is compiled, :mod:`kvcompass.worker.cache`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from kvcompass.frozen_init import frozen_init
from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.wire import EventKind

__all__ = ["CacheMatch", "EvictionPolicy", "OnChange", "PrefixChange"]


class EvictionPolicy(StrEnum):
    """Which frontier block leaves its tier first."""

    LRU = "lru"  # least recently used
    LFU = "lfu"  # fewest uses (ties: least recently used)
    FIFO = "fifo"  # cached earliest (promotion and reuse do not renew it)


@frozen_init
@dataclass(frozen=True, slots=True)
class PrefixChange:
    """One change the index must learn: the prefixes of ``tokens`` at ``lengths``."""

    namespace: Namespace
    kind: EventKind
    tier: Tier  # ABSENT for an eviction
    tokens: NDArray[np.uint32]  # as long as the longest of ``lengths``
    lengths: tuple[int, ...]  # ascending registration lengths


OnChange = Callable[[PrefixChange], None]


@frozen_init
@dataclass(frozen=True, slots=True)
class CacheMatch:
    """The held prefix of a prompt: ``tokens`` long, the last ``dram_tokens`` in DRAM."""

    tokens: int = 0
    dram_tokens: int = 0

    @property
    def tier(self) -> Tier:
        if self.tokens == 0:
            return Tier.ABSENT
        return Tier.DRAM if self.dram_tokens else Tier.VRAM
