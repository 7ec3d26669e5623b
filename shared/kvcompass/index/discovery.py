"""The multi-level discovery index: per-shard region tables, and the lookup over them.

The maintenance side of a shard is :class:`kvcompass.index.shard_tables.ShardTables`.
``MultiLevelQuery`` holds a prompt's keys at the lengths an edge queries toward each
region; ``MatchProbes`` lays out their lookups for the compiled match
(:mod:`kvcompass.index.probe`), which finds, for every worker anywhere, the longest
matched length and the tier there. ``DiscoveryView`` is an edge's keyless replica of
every shard in this process; it and the shared-memory reader are the two
:class:`~kvcompass.index.reader.IndexReader` implementations.
"""

from __future__ import annotations

import copy
import functools
import operator
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import BadInput
from kvcompass.frozen_init import SlotBuilder, field_builder, frozen_init
from kvcompass.index import probe, probe_call
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.patches import TablePatch
from kvcompass.index.region_pairs import region_pairs
from kvcompass.index.view import LudoView
from kvcompass.keys import Namespace, PrefixHasher, TokenIds
from kvcompass.levels import LevelPlan

__all__ = [
    "DiscoveryView",
    "Match",
    "MatchProbes",
    "MultiLevelQuery",
    "QueryPlanner",
    "TableKey",
]

#: (shard, table id): one Ludo table.
TableKey = tuple[int, int]


@frozen_init
@dataclass(frozen=True, slots=True)
class Match:
    """Per worker (global index): longest matched prefix length (0: none) and its tier."""

    lengths: list[int]
    tiers: list[int]

    def holders(self) -> dict[int, tuple[int, Tier]]:
        return {w: (n, Tier(self.tiers[w])) for w, n in enumerate(self.lengths) if n}


@frozen_init
@dataclass(frozen=True, slots=True)
class MultiLevelQuery:
    """A prompt's keys at the lengths one edge queries, per target region, ascending.

    ``chained``: a worker's hit at a length counts only if it also hit at the region's
    previous queried length, or for the first one at the region's guard length when a
    :class:`QueryPlanner` built the query (see :func:`kvcompass.index.probe.match_probes`),
    which turns away most false locators; False: every hit counts (the paper's lookup).
    """

    per_region: Mapping[str, Sequence[tuple[int, int]]]
    chained: bool = False

    @classmethod
    def for_prompt(
        cls,
        tokens: TokenIds,
        edge_region: str,
        plan: LevelPlan,
        namespace: Namespace,
        chained: bool = False,
    ) -> MultiLevelQuery:
        """Hash the prompt once, at the union of the lengths the edge queries."""
        return QueryPlanner(plan, edge_region, namespace, chained).query(tokens)


class QueryPlanner:
    """One edge's query lengths, resolved once; :meth:`query` is then per request.

    Chained, the planner also hashes each region's guard length: the longest length the
    region's workers register below the first one this edge queries there (none for a
    region whose first queried length is its shortest registered one). A worker's hit at
    that first length then counts only if it also hit at the guard, which credits
    nothing itself (:func:`kvcompass.index.probe.match_probes`).
    """

    def __init__(
        self, plan: LevelPlan, edge_region: str, namespace: Namespace, chained: bool = False
    ) -> None:
        self.edge_region = edge_region
        self.namespace = namespace
        self.chained = chained
        queries = plan.queries_from(edge_region)
        guards = {
            region: guard
            for region, lengths in queries.items()
            if chained and (guard := _guard_length(plan.registration_lengths[region], lengths))
        }
        lengths = sorted(set(plan.all_query_lengths(edge_region)) | set(guards.values()))
        self._hasher = PrefixHasher(lengths, namespace, plan.key_hash)
        at = {c: i for i, c in enumerate(self._hasher.lengths)}
        self._shape = _shape(
            tuple(
                (region, tuple((c, at[c]) for c in lengths if c in at))
                for region, lengths in queries.items()
            ),
            tuple((region, (g, at[g])) for region, g in guards.items()),
            chained,
        )

    def for_namespace(self, namespace: Namespace) -> QueryPlanner:
        """This planner in another namespace: the same lengths and shape (the plan's and
        the edge's alone), a hasher of its own."""
        planner = copy.copy(self)
        planner.namespace = namespace
        planner._hasher = self._hasher.for_namespace(namespace)
        return planner

    @property
    def guard_lengths(self) -> dict[str, int]:
        """Each guarded region's guard length (none unless chained)."""
        return {region: length for region, (length, _) in self._shape.guards.items()}

    def query(self, tokens: TokenIds) -> MultiLevelQuery:
        regions = _new_planned(self._shape, self._hasher.key_array(tokens))
        return _new_query(regions, self.chained)


def _guard_length(registered: Sequence[int], queried: Sequence[int]) -> int:
    """The longest registered length below the first queried one (0: none)."""
    if not queried:
        return 0
    return max((c for c in registered if c < queried[0]), default=0)


class _Shape:
    """Per target region of a planner, its query lengths and guard length, where their
    keys sit in the planner's key list, and whether the query is chained. One object per
    plan (:func:`_shape`), shared by the plan's planners (one per namespace), so that a
    reader keeps one set of probe rows per plan (:class:`MatchProbes`) and finds them by
    identity, whichever of the planners asks."""

    __slots__ = ("chained", "guards", "regions")

    def __init__(
        self,
        regions: tuple[tuple[str, tuple[tuple[int, int], ...]], ...],
        guards: tuple[tuple[str, tuple[int, int]], ...],
        chained: bool,
    ) -> None:
        self.regions = dict(regions)
        self.guards = dict(guards)
        self.chained = chained


@functools.lru_cache(maxsize=256)
def _shape(
    regions: tuple[tuple[str, tuple[tuple[int, int], ...]], ...],
    guards: tuple[tuple[str, tuple[int, int]], ...],
    chained: bool,
) -> _Shape:
    """The one shape object of a plan."""
    return _Shape(regions, guards, chained)


class _PlannedRegions(Mapping[str, list[tuple[int, int]]]):
    """A planner's ``per_region``, each region's pairs built when asked for: the readers
    take the key array as it is, and the policy reads one region, if any."""

    __slots__ = ("key_array", "shape")
    # Built by _new_planned, once per request.
    shape: _Shape
    key_array: array[int]  # at the first len(key_array) of the planner's lengths

    def __getitem__(self, region: str) -> list[tuple[int, int]]:
        return region_pairs(self.shape.regions[region], self.key_array)

    def get(self, region: str, default: Any = None) -> Any:
        # Mapping.get goes through __getitem__ and a KeyError: the policy asks for its own
        # region on every decision.
        regions = self.shape.regions
        return region_pairs(regions[region], self.key_array) if region in regions else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.shape.regions)

    def __len__(self) -> int:
        return len(self.shape.regions)

    def __repr__(self) -> str:
        return repr(dict(self))


# Per request, valid by construction: built without __init__ (kvcompass.frozen_init).
_new_query = field_builder(MultiLevelQuery)
_new_match = field_builder(Match)
_new_planned = SlotBuilder(_PlannedRegions, ("shape", "key_array"))


class MatchProbes:
    """A layout's lookups of a query as input for the compiled match.

    :meth:`rows` gives the query's keys and (key index, table id, length, after) rows per
    table of each region the query names, by ascending length, so that
    :func:`kvcompass.index.probe.match_probes` lets a longer match overwrite a shorter
    one (``after``: the region's previous length for a chained query, else
    :data:`~kvcompass.index.probe.UNCHECKED`); a planned chained query's region starts
    with its guard row (:class:`QueryPlanner`). ``workers`` maps its table fields to
    global workers. Both readers, the in-process view and the shared-memory one, probe
    through it.
    """

    def __init__(self, layout: IndexLayout) -> None:
        self.n_tables = len(layout.tables)
        self.workers = probe.table_workers([t.workers for t in layout.tables])
        self._region_tables = {
            region: tuple(t.table_id for t in layout.tables_of(region))
            for region in dict.fromkeys(t.region for t in layout.tables)
        }
        self._planned: dict[_Shape, NDArray[np.int64]] = {}

    def rows(
        self, query: MultiLevelQuery
    ) -> tuple[array[int] | NDArray[np.int64], NDArray[np.int64]]:
        """The query's keys (63-bit: an ``array("Q")`` or int64) and its probe rows."""
        regions = query.per_region
        if isinstance(regions, _PlannedRegions):
            # A planner's rows cover all its lengths (the kernel skips those past the
            # prompt's keys): built once per plan, not per request.
            shape = regions.shape
            probes = self._planned.get(shape)
            if probes is None:
                probes = self._rows(shape.regions, shape.chained, shape.guards)
                self._planned[shape] = probes
            return regions.key_array, probes  # 63-bit: the kernel takes them as they are
        keys: list[int] = []
        indexed: dict[str, list[tuple[int, int]]] = {}
        for region, pairs in regions.items():
            indexed[region] = [(c, i) for i, (c, _) in enumerate(pairs, len(keys))]
            keys += [key for _, key in pairs]
        return np.array(keys, np.int64), self._rows(indexed, query.chained, {})

    def _rows(
        self,
        regions: Mapping[str, Sequence[tuple[int, int]]],
        chained: bool,
        guards: Mapping[str, tuple[int, int]],
    ) -> NDArray[np.int64]:
        flat: list[int] = []
        extend = flat.extend
        region_tables = self._region_tables
        for region, pairs in regions.items():
            tables = region_tables.get(region)
            if tables is None:
                raise BadInput(f"query names region {region!r}, not one of this index")
            guard = guards.get(region) if chained else None
            for table in tables:
                after = 0
                if guard is not None:  # a negative length: the kernel credits no guard
                    length, at = guard
                    extend((at, table, -length, probe.UNCHECKED))
                    after = -length
                for length, at in pairs:
                    extend((at, table, length, after if chained else probe.UNCHECKED))
                    after = length
        return np.array(flat, dtype=np.int64).reshape(-1, 4)


class DiscoveryView:
    """An edge's keyless replica of every shard's region tables, in this process.

    :meth:`match` runs every lookup of a query in one compiled call, as the shared-memory
    reader does: in Python each costs four mixes on big integers, and a 4K-token prompt
    needs 8 (testbed-3region) to 70 (sim-16region) of them.
    """

    def __init__(self, layout: IndexLayout, n_shards: int, views: Mapping[TableKey, LudoView]):
        missing = {(s, t.table_id) for s in range(n_shards) for t in layout.tables} - set(views)
        if missing:
            raise ValueError(f"views missing for {len(missing)} tables, e.g. {min(missing)}")
        self.layout = layout
        self.n_shards = n_shards
        self.views = dict(views)
        self._probes = MatchProbes(layout)
        # In the kernel's descriptor order: row shard * n_tables + table id.
        self._tables = [
            self.views[(s, t)] for s in range(n_shards) for t in range(self._probes.n_tables)
        ]
        self._bindings = LudoView.bindings
        self._rows = [view.descriptor for view in self._tables]
        self._lengths = np.zeros(layout.n_workers, np.int64)
        self._tiers = np.zeros(layout.n_workers, np.int64)
        self._touched = np.zeros(n_shards, np.uint8)
        self._target = self._match_target(self._rows)
        probe.warm_up()

    @classmethod
    def from_images(
        cls, layout: IndexLayout, n_shards: int, images: Mapping[TableKey, bytes]
    ) -> DiscoveryView:
        return cls(layout, n_shards, {k: LudoView(img) for k, img in images.items()})

    def apply(self, patches: Mapping[TableKey, TablePatch]) -> None:
        for where, patch in patches.items():
            self.views[where].apply(patch)

    def ready(self) -> bool:
        """Always: every table is in memory from construction on."""
        return True

    def match(self, query: MultiLevelQuery) -> Match:
        """Longest matched length and tier of every worker, over all levels and regions."""
        if LudoView.bindings != self._bindings:
            # Some view of the process rebound (a reload, an Othello reset); if one of
            # ours did (the simulator applies patches to the views themselves), the
            # kernel must not read its old buffer or seeds.
            self._bindings = LudoView.bindings
            rows = [view.descriptor for view in self._tables]
            if not all(map(operator.is_, rows, self._rows)):
                self._rows = rows
                self._target = self._match_target(rows)
        target = self._target
        probe_call.match_at(target, *self._probes.rows(query))
        return _new_match(*target.lists())

    def _match_target(self, rows: list[NDArray[np.uint64]]) -> probe_call.MatchTarget:
        """The match's arrays, checked once: descriptor rows (in the kernel's order), the
        tables' workers and the outputs."""
        return probe_call.MatchTarget(
            np.array(rows),
            self._probes.n_tables,
            self._probes.workers,
            self._lengths,
            self._tiers,
            self._touched,
        )

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views.values())
