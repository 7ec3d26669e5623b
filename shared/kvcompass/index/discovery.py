"""The multi-level discovery index: per-shard region tables, and the lookup over them.

The maintenance side of a shard is :class:`kvcompass.index.shard_tables.ShardTables`.
``DiscoveryView`` is an edge's keyless replica of every shard. ``MultiLevelQuery`` holds a
prompt's keys at the lengths an edge queries toward each region, and
:meth:`DiscoveryView.match` answers, for every worker anywhere, the longest matched length
and the tier there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvcompass.hashing import MASK64
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.patches import TablePatch
from kvcompass.index.view import LudoView
from kvcompass.keys import SHARD_SALT, Namespace, TokenIds, prefix_keys
from kvcompass.levels import LevelPlan

__all__ = [
    "DiscoveryView",
    "Match",
    "MultiLevelQuery",
    "QueryPlanner",
    "TableKey",
]

#: (shard, table id): one Ludo table.
TableKey = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Match:
    """Per worker (global index): longest matched prefix length (0: none) and its tier."""

    lengths: list[int]
    tiers: list[int]

    def holders(self) -> dict[int, tuple[int, Tier]]:
        return {w: (n, Tier(self.tiers[w])) for w, n in enumerate(self.lengths) if n}


@dataclass(frozen=True, slots=True)
class MultiLevelQuery:
    """A prompt's keys at the lengths one edge queries, per target region, ascending."""

    per_region: Mapping[str, Sequence[tuple[int, int]]]

    @classmethod
    def for_prompt(
        cls, tokens: TokenIds, edge_region: str, plan: LevelPlan, namespace: Namespace
    ) -> MultiLevelQuery:
        """Hash the prompt once, at the union of the lengths the edge queries."""
        return QueryPlanner(plan, edge_region, namespace).query(tokens)


class QueryPlanner:
    """One edge's query lengths, resolved once; :meth:`query` is then per request."""

    def __init__(self, plan: LevelPlan, edge_region: str, namespace: Namespace) -> None:
        self.edge_region = edge_region
        self.namespace = namespace
        self._targets = tuple(plan.queries_from(edge_region).items())
        self._lengths = plan.all_query_lengths(edge_region)

    def query(self, tokens: TokenIds) -> MultiLevelQuery:
        keys = prefix_keys(tokens, self._lengths, self.namespace)
        return MultiLevelQuery(
            {
                region: [(n, keys[n]) for n in lengths if n in keys]
                for region, lengths in self._targets
            }
        )


class DiscoveryView:
    """An edge's keyless replica of every shard's region tables."""

    def __init__(self, layout: IndexLayout, n_shards: int, views: Mapping[TableKey, LudoView]):
        missing = {(s, t.table_id) for s in range(n_shards) for t in layout.tables} - set(views)
        if missing:
            raise ValueError(f"views missing for {len(missing)} tables, e.g. {min(missing)}")
        self.layout = layout
        self.n_shards = n_shards
        self.views = dict(views)
        self._lookups: list[list[Callable[[int], int]]] = []
        self._bind_lookups()
        self._region_tables = {
            region: [(t.table_id, t.workers) for t in layout.tables_of(region)]
            for region in {t.region for t in layout.tables}
        }

    @classmethod
    def from_images(
        cls, layout: IndexLayout, n_shards: int, images: Mapping[TableKey, bytes]
    ) -> DiscoveryView:
        return cls(layout, n_shards, {k: LudoView(img) for k, img in images.items()})

    def _bind_lookups(self) -> None:
        n_tables = len(self.layout.tables)
        self._lookups = [
            [self.views[(s, t)].lookup for t in range(n_tables)] for s in range(self.n_shards)
        ]

    def apply(self, patches: Mapping[TableKey, TablePatch]) -> None:
        for where, patch in patches.items():
            self.views[where].apply(patch)

    def match(self, query: MultiLevelQuery) -> Match:
        """Longest matched length and tier of every worker, over all levels and regions."""
        n_workers = self.layout.n_workers
        lengths = [0] * n_workers
        tiers = [0] * n_workers
        n_shards = self.n_shards
        lookups = self._lookups
        for region, pairs in query.per_region.items():
            for table_id, workers in self._region_tables[region]:
                # Ascending lengths: a longer match overwrites a shorter one.
                for length, key in pairs:
                    # shard_of(key, n_shards), inlined: this loop is the per-request cost.
                    x = key ^ SHARD_SALT
                    x ^= x >> 33
                    x = (x * 0xFF51AFD7ED558CCD) & MASK64
                    x ^= x >> 33
                    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
                    shard = (x ^ (x >> 33)) % n_shards
                    value = lookups[shard][table_id](key)
                    while value:
                        bit = (value & -value).bit_length() - 1
                        shift = bit & ~1
                        w = workers[bit >> 1]
                        lengths[w] = length
                        tiers[w] = (value >> shift) & 3
                        value &= ~(3 << shift)
        return Match(lengths, tiers)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views.values())
