"""Types of the compiled prefix cache (cache.pyx); the docstrings are there."""

from collections.abc import Iterator, Sequence
from typing import final

from typing_extensions import disjoint_base

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, TokenIds
from kvcompass.topology import Topology, Worker
from kvcompass.worker.cache_values import CacheMatch as CacheMatch
from kvcompass.worker.cache_values import EvictionPolicy as EvictionPolicy
from kvcompass.worker.cache_values import OnChange as OnChange
from kvcompass.worker.cache_values import PrefixChange as PrefixChange

__all__ = ["CacheMatch", "EvictionPolicy", "OnChange", "PrefixCache", "PrefixChange"]

@final
class _Run:
    namespace: Namespace
    parent: _Run | None
    source: bytes
    first: int
    last: int
    children: dict[bytes, _Run]
    tier: int
    base: int
    uses: int
    pin: int
    version: int
    vram_children: int
    def __init__(
        self,
        namespace: Namespace,
        parent: _Run | None,
        source: bytes,
        first: int,
        last: int,
        tier: int,
        base: int,
        uses: int,
        pin: int,
        version: int,
    ) -> None: ...

@disjoint_base
class PrefixCache:
    @property
    def block_size(self) -> int: ...
    @property
    def policy(self) -> EvictionPolicy: ...
    @property
    def rebuilds(self) -> int: ...
    @property
    def walks(self) -> int: ...
    @property
    def _roots(self) -> dict[Namespace, _Run]: ...
    def __init__(
        self,
        block_size: int,
        vram_blocks: int,
        dram_blocks: int,
        registration_lengths: Sequence[int],
        policy: EvictionPolicy = ...,
        on_change: OnChange | None = None,
    ) -> None: ...
    @classmethod
    def for_worker(
        cls,
        topology: Topology,
        worker: Worker,
        policy: EvictionPolicy = ...,
        on_change: OnChange | None = None,
    ) -> PrefixCache: ...
    @property
    def capacity(self) -> dict[Tier, int]: ...
    @property
    def used(self) -> dict[Tier, int]: ...
    def match(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch: ...
    def blocks(self, tier: Tier) -> int: ...
    def check(self) -> None: ...
    def held(self) -> Iterator[PrefixChange]: ...
    def use(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch: ...
    def load(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch: ...
    def clear(self) -> None: ...
