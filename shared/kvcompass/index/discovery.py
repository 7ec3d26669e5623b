"""The multi-level discovery index: per-shard region tables, and the lookup over them.

The maintenance side of a shard is :class:`kvcompass.index.shard_tables.ShardTables`.
``MultiLevelQuery`` holds a prompt's keys at the lengths an edge queries toward each
region; ``MatchDecoder`` turns the table values of those keys into, for every worker
anywhere, the longest matched length and the tier there. ``DiscoveryView`` is an edge's
keyless replica of every shard in this process; it and the shared-memory reader are the
two :class:`~kvcompass.index.reader.IndexReader` implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvcompass.errors import BadInput
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.patches import TablePatch
from kvcompass.index.view import LudoView
from kvcompass.keys import Namespace, PrefixHasher, TokenIds, shard_of
from kvcompass.levels import LevelPlan

__all__ = [
    "DiscoveryView",
    "Match",
    "MatchDecoder",
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
        self._hasher = PrefixHasher(plan.all_query_lengths(edge_region), namespace, plan.key_hash)

    def query(self, tokens: TokenIds) -> MultiLevelQuery:
        keys = self._hasher.keys(tokens)
        return MultiLevelQuery(
            {
                region: [(n, keys[n]) for n in lengths if n in keys]
                for region, lengths in self._targets
            }
        )


class MatchDecoder:
    """Table values to per-worker matches, as the in-process view decodes them.

    :meth:`decode` asks ``value_of(table id, key)`` for each lookup a query needs. The
    shared-memory reader decodes the same way in compiled code (``kvcompass.index.probe``;
    tests check the two agree).
    """

    def __init__(self, layout: IndexLayout) -> None:
        self.n_workers = layout.n_workers
        self._region_tables = {
            region: tuple((t.table_id, t.workers) for t in layout.tables_of(region))
            for region in {t.region for t in layout.tables}
        }

    def _tables_of(self, region: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
        try:
            return self._region_tables[region]
        except KeyError:
            raise BadInput(f"query names region {region!r}, not one of this index") from None

    def decode(self, query: MultiLevelQuery, value_of: Callable[[int, int], int]) -> Match:
        """Longest matched length and tier of every worker, over all levels and regions."""
        lengths = [0] * self.n_workers
        tiers = [0] * self.n_workers
        for region, pairs in query.per_region.items():
            for table_id, workers in self._tables_of(region):
                # Ascending lengths: a longer match overwrites a shorter one.
                for length, key in pairs:
                    value = value_of(table_id, key)
                    while value:
                        bit = (value & -value).bit_length() - 1
                        shift = bit & ~1
                        w = workers[bit >> 1]
                        lengths[w] = length
                        tiers[w] = (value >> shift) & 3
                        value &= ~(3 << shift)
        return Match(lengths, tiers)


class DiscoveryView:
    """An edge's keyless replica of every shard's region tables, in this process."""

    def __init__(self, layout: IndexLayout, n_shards: int, views: Mapping[TableKey, LudoView]):
        missing = {(s, t.table_id) for s in range(n_shards) for t in layout.tables} - set(views)
        if missing:
            raise ValueError(f"views missing for {len(missing)} tables, e.g. {min(missing)}")
        self.layout = layout
        self.n_shards = n_shards
        self.views = dict(views)
        self._lookups: list[list[Callable[[int], int]]] = []
        self._bind_lookups()
        self._decoder = MatchDecoder(layout)

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

    def ready(self) -> bool:
        """Always: every table is in memory from construction on."""
        return True

    def match(self, query: MultiLevelQuery) -> Match:
        """Longest matched length and tier of every worker, over all levels and regions."""
        lookups = self._lookups
        n_shards = self.n_shards
        return self._decoder.decode(
            query, lambda table_id, key: lookups[shard_of(key, n_shards)][table_id](key)
        )

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views.values())
