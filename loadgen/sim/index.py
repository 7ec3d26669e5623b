"""The discovery index in the simulator: the real maintenance writers and edge views,
connected by in-memory queues with an update delay and loss.

Workers' event batches reach their shard's :class:`ShardWriter` at once (the event bus
is in-region and fast next to the WAN; the delay under study is MU → edge). Every
``flush_ms`` each writer that read something flushes a :class:`PatchBatch`, which every
edge region receives ``update_delay_ms`` later unless its draw loses it. An edge keeps
one :class:`DiscoveryView` (what its policy reads, as an :class:`IndexReader`) and one
:class:`PatchFollower` per shard, as the live edge replayer does. With ``resync`` the
follower's verdict decides: a gap or new epoch asks the writer for a fresh snapshot
(flush, then snapshot, so the edge resumes at the next batch), which arrives after the
same delay; every ``snapshot_every_s`` the MUs snapshot every shard and each edge compares
(anti-entropy, catching a lost last batch). Without it an edge applies every batch that
arrives, in arrival order, and nothing repairs a loss. Snapshots carry the view halves
alone: an edge reads nothing else (a maintenance unit restores from the key halves too).
Without loss an edge can never be behind a round's snapshot, so the round sends its
meta alone, and a replica found behind it stops the run (the plane broke, not the WAN).

Without loss every edge region would hold the same replica at every moment, so the
plane keeps one (``replicas``) and maps every region to it (``edges``): the same code
runs once per batch instead of once per region, and the replica counts in ``stats`` are
per distinct replica.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np

from kvcompass.errors import InvariantBroken
from kvcompass.index.discovery import DiscoveryView, Match, MultiLevelQuery
from kvcompass.index.errors import GenerationMismatch
from kvcompass.index.layout import IndexLayout
from kvcompass.index.ludo import LudoTable
from kvcompass.index.view import LudoView
from kvcompass.pipeline.follower import PatchFollower, SnapshotCheck, Verdict
from kvcompass.pipeline.writer import ShardWriter
from kvcompass.snapshot import ShardSnapshot, SnapshotMeta
from kvcompass.topology import Topology
from kvcompass.virtual_time import EventQueue, VirtualClock
from kvcompass.wire import KVEventBatch, PatchBatch, TableReload

__all__ = ["EdgeIndex", "IndexPlane"]

#: Read per batch: through the enum class, each read costs ~40 ns.
_APPLY, _RESYNC = Verdict.APPLY, Verdict.RESYNC
#: Keys a new table holds before it first grows (the live MU's default).
_INITIAL_CAPACITY = 65_536
#: Table-reload snapshots the plane keeps for edges (older ones were superseded).
_KEPT_RELOADS = 64


class EdgeIndex:
    """An edge replica: a DiscoveryView its regions' policies read, a follower per shard."""

    def __init__(self, plane: IndexPlane, region: str) -> None:
        self.plane = plane
        self.region = region
        self.followers = [PatchFollower(s) for s in range(plane.n_shards)]
        self._views: dict[tuple[int, int], LudoView] = {}
        self._view: DiscoveryView | None = None
        self._awaiting = [False] * plane.n_shards  # a resync snapshot is on its way
        self.applied = self.skipped = self.resyncs = self.refused = 0

    # IndexReader
    def match(self, query: MultiLevelQuery) -> Match:
        assert self._view is not None
        return self._view.match(query)

    def ready(self) -> bool:
        return self._view is not None

    def load(self, snapshot: ShardSnapshot) -> None:
        """Replace the shard's tables by the snapshot's and follow its writer from there."""
        shard = snapshot.meta.shard
        for table, image in snapshot.views.items():
            self._views[(shard, table)] = LudoView(image)
        self._rebind()
        self.followers[shard].loaded(snapshot.meta)
        self._awaiting[shard] = False

    def _rebind(self) -> None:
        if len(self._views) == self.plane.n_shards * len(self.plane.layout.tables):
            self._view = DiscoveryView(self.plane.layout, self.plane.n_shards, self._views)

    def receive(self, batch: PatchBatch) -> None:
        shard = batch.shard
        if not self.plane.resync:
            self._apply(batch)
            return
        follower = self.followers[shard]
        verdict = follower.offer(batch)
        if verdict is _APPLY:
            if self._apply(batch):
                follower.applied(batch)
        elif verdict is _RESYNC:
            self._resync(shard)
        else:
            self.skipped += 1

    def compare(self, snapshot: ShardSnapshot) -> None:
        """Anti-entropy: load the shard's periodic snapshot if the view is behind it."""
        if self.followers[snapshot.meta.shard].compare(snapshot.meta) is not SnapshotCheck.CURRENT:
            self.resyncs += 1
            self.load(snapshot)

    def confirm_current(self, meta: SnapshotMeta) -> None:
        """Anti-entropy where nothing is lost: every batch before ``meta`` reached this
        replica first, so it is current; behind, the plane itself is broken."""
        if self.followers[meta.shard].compare(meta) is not SnapshotCheck.CURRENT:
            raise InvariantBroken(
                f"a lossless edge replica is behind shard {meta.shard}'s writer at "
                f"epoch {meta.epoch}, batch {meta.next_seq}"
            )

    def _resync(self, shard: int) -> None:
        if not self._awaiting[shard]:
            self._awaiting[shard] = True
            self.resyncs += 1
            self.plane.request_snapshot(self, shard)

    def _apply(self, batch: PatchBatch) -> bool:
        """Apply a batch's tables; False if a table could not take its patch."""
        shard = batch.shard
        try:
            for entry in batch.tables:
                patch = entry.patch
                if isinstance(patch, TableReload):
                    image = self.plane.reload_image(patch.snapshot_key, entry.table_id)
                    self._views[(shard, entry.table_id)] = LudoView(image)
                    self._rebind()
                else:
                    self._views[(shard, entry.table_id)].apply(patch)
        except GenerationMismatch:
            # A lost reload left the table a generation behind: only a snapshot helps.
            self.refused += 1
            if self.plane.resync:
                self.followers[shard].unload()
                self._resync(shard)
            return False
        self.applied += 1
        return True

    def divergent_tables(self, truth: Mapping[tuple[int, int], LudoTable]) -> int:
        """Tables whose view differs from ``truth``'s (the writers' tables), byte for byte
        past the header."""
        return sum(
            not np.array_equal(self._views[where].payload(), table.view_payload())
            for where, table in truth.items()
        )


class IndexPlane:
    """The shards' writers and every edge region's replica; see the module docstring."""

    def __init__(
        self,
        topology: Topology,
        n_shards: int,
        clock: VirtualClock,
        events: EventQueue,
        *,
        flush_ms: float,
        update_delay_ms: float,
        update_loss: float,
        resync: bool,
        snapshot_every_s: float,
        seed: int,
    ) -> None:
        self.n_shards = n_shards
        self.layout = IndexLayout.from_topology(topology)
        self.resync = resync
        self._clock = clock
        self._events = events
        self._flush_s = flush_ms / 1e3
        self._delay_s = update_delay_ms / 1e3
        self._loss = update_loss
        self._snapshot_every_s = snapshot_every_s
        self._rng = random.Random(seed)
        self.writers = [
            ShardWriter(
                s,
                n_shards,
                topology,
                owner="sim-mu",
                clock=clock,
                initial_capacity=_INITIAL_CAPACITY,
                rng=random.Random(seed * 1_000_003 + s),
            )
            for s in range(n_shards)
        ]
        self._offsets = [0] * n_shards
        self._dirty: set[int] = set()
        self._flush_due = False
        self._reloads: dict[str, dict[int, bytes]] = {}
        regions = [r.name for r in topology.regions]
        if update_loss:
            #: The distinct replicas; ``edges`` maps each region to the one its policy reads.
            self.replicas = [EdgeIndex(self, r) for r in regions]
            self.edges = dict(zip(regions, self.replicas, strict=True))
        else:
            # Without loss every region receives the same batches and snapshots at the
            # same simulated time (one delay for all), so their replicas stay identical
            # at every read: one replica, applied once, serves every region's policy.
            shared = EdgeIndex(self, "every region")
            self.replicas = [shared]
            self.edges = dict.fromkeys(regions, shared)
        for writer in self.writers:
            writer.take_over(None, stream_epoch=None, stream_end=0, committed=False, events_low=0)
            snapshot = writer.snapshot(keys=False)
            for edge in self.replicas:
                edge.load(snapshot)
        self.batches = self.lost = 0
        if resync:
            events.push(clock.monotonic() + snapshot_every_s, self._anti_entropy)

    def send(self, shard: int, batch: KVEventBatch) -> None:
        """A worker's batch reaches its shard's writer (staged; written at the flush)."""
        self.writers[shard].stage(batch, self._offsets[shard])
        self._offsets[shard] += 1
        self._dirty.add(shard)
        if not self._flush_due:
            self._flush_due = True
            self._events.push(self._clock.monotonic() + self._flush_s, self._flush_all)

    def _flush_all(self, _: object = None) -> None:
        self._flush_due = False
        for shard in sorted(self._dirty):
            self._flush(shard)
        self._dirty.clear()

    def _flush(self, shard: int) -> None:
        batch = self.writers[shard].flush(self._persist)
        if batch is None:
            return
        self.batches += 1
        due = self._clock.monotonic() + self._delay_s
        for edge in self.replicas:
            if self._loss and self._rng.random() < self._loss:
                self.lost += 1
                continue
            self._events.push(due, edge.receive, batch)

    def _persist(self, snapshot: ShardSnapshot) -> str:
        """A grown table's image for the edges (the live MU stores it in Redis)."""
        key = f"{snapshot.meta.shard}/{snapshot.meta.epoch}/{snapshot.meta.next_seq}"
        self._reloads[key] = snapshot.views
        while len(self._reloads) > _KEPT_RELOADS:
            del self._reloads[next(iter(self._reloads))]
        return key

    def reload_image(self, key: str, table: int) -> bytes:
        try:
            return self._reloads[key][table]
        except KeyError:
            raise InvariantBroken(f"reload snapshot {key!r} table {table} is gone") from None

    def _flush_before_snapshot(self, shard: int) -> None:
        self._flush(shard)  # patches since the last flush go out first
        self._dirty.discard(shard)

    def _fresh_snapshot(self, shard: int) -> ShardSnapshot:
        self._flush_before_snapshot(shard)
        return self.writers[shard].snapshot(keys=False)  # edges read the views alone

    def request_snapshot(self, edge: EdgeIndex, shard: int) -> None:
        self._events.push(
            self._clock.monotonic() + self._delay_s, edge.load, self._fresh_snapshot(shard)
        )

    def _anti_entropy(self, _: object = None) -> None:
        due = self._clock.monotonic() + self._delay_s
        for shard in range(self.n_shards):
            if self._loss:
                snapshot = self._fresh_snapshot(shard)
                for edge in self.replicas:
                    self._events.push(due, edge.compare, snapshot)
                continue
            # Nothing is lost: every batch sent before the snapshot reaches the edges
            # before it (same delay, sent first), so they find their views current and
            # never load its images. Only the meta travels (sealing the images cost a
            # run 3-4 %), and a replica found behind stops the run.
            self._flush_before_snapshot(shard)
            meta = self.writers[shard].snapshot_meta()
            for edge in self.replicas:
                self._events.push(due, edge.confirm_current, meta)
        self._events.push(self._clock.monotonic() + self._snapshot_every_s, self._anti_entropy)

    def divergent_tables(self) -> int:
        """Tables, summed over edges, whose view differs from its writer's now."""
        truth = {
            (shard, table_id): table
            for shard, writer in enumerate(self.writers)
            for table_id, table in writer.tables.tables.items()
        }
        return sum(edge.divergent_tables(truth) for edge in self.replicas)

    def stats(self) -> Mapping[str, int]:
        edges = self.replicas
        return {
            "patch_batches": self.batches,
            "patch_batches_lost": self.lost,
            "edge_resyncs": sum(e.resyncs for e in edges),
            "edge_refused_patches": sum(e.refused for e in edges),
            "index_keys_applied": sum(w.applied_keys for w in self.writers),
        }
