"""The simulated index pipeline: lost patch batches and the edge's resync.

Patches between the maintenance units and the edges are lost at random. Without resync
(the paper's edges) a lost batch's bits stay wrong until the same table cells are
written again, so views drift from their writers; with the follower's gap detection
and the periodic snapshot comparison every view ends equal to its writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from kvcompass.errors import InvariantBroken
from kvcompass.loadgen.sim import SimConfig, Simulation
from kvcompass.loadgen.sim.testing import shared_prefixes
from kvcompass.pipeline.follower import SnapshotCheck
from kvcompass.routing.testing import TOY
from kvcompass.snapshot import SnapshotMeta

REQUESTS = shared_prefixes(TOY, rate=40.0, count=300, seed=4)


def run(loss: float, resync: bool, snapshot_every_s: float = 0.5) -> dict[str, Any]:
    config = SimConfig(
        TOY,
        policy="kvcompass",
        seed=4,
        update_delay_ms=20.0,
        update_loss=loss,
        resync=resync,
        snapshot_every_s=snapshot_every_s,
    )
    # Settle past one snapshot period: patches in flight land, anti-entropy runs.
    return Simulation(config).run(REQUESTS, settle_s=1.0).stats


def test_without_loss_views_equal_their_writers() -> None:
    stats = run(0.0, resync=False)
    assert stats["patch_batches"] > 100
    assert stats["patch_batches_lost"] == 0
    assert stats["index_divergent_tables"] == 0


def test_loss_without_resync_leaves_views_divergent() -> None:
    stats = run(0.3, resync=False)
    assert stats["patch_batches_lost"] > 0
    assert stats["edge_resyncs"] == 0
    assert stats["index_divergent_tables"] > 0


def test_loss_with_resync_converges() -> None:
    stats = run(0.3, resync=True)
    assert stats["patch_batches_lost"] > 0
    assert stats["edge_resyncs"] > 0
    assert stats["index_divergent_tables"] == 0


def test_gap_detection_alone_repairs_most_of_the_loss() -> None:
    """Without anti-entropy only a lost *last* batch of a shard goes unnoticed."""
    gaps_only = run(0.3, resync=True, snapshot_every_s=1e6)
    unrepaired = run(0.3, resync=False)
    assert gaps_only["edge_resyncs"] > 0
    assert gaps_only["index_divergent_tables"] < unrepaired["index_divergent_tables"]


def simulation(loss: float) -> Simulation:
    config = SimConfig(TOY, seed=4, update_delay_ms=20.0, update_loss=loss, resync=False)
    sim = Simulation(config)
    sim.run(REQUESTS, settle_s=1.0)  # every batch in flight lands
    return sim


def test_without_loss_every_region_reads_one_replica_that_applies_each_batch_once() -> None:
    sim = simulation(0.0)
    (replica,) = sim.index.replicas
    assert all(edge is replica for edge in sim.index.edges.values())
    assert replica.applied == sim.index.batches > 100


def test_with_loss_each_region_keeps_its_own_replica_and_draws_its_own_losses() -> None:
    sim = simulation(0.3)
    replicas = sim.index.replicas
    assert len(replicas) == len(TOY.regions) > 1
    assert list(sim.index.edges.values()) == replicas
    applied = [r.applied for r in replicas]
    assert len(set(applied)) > 1  # independent draws: the regions lost different batches
    assert sum(applied) + sim.index.lost == sim.index.batches * len(replicas)


def test_without_loss_the_anti_entropy_round_finds_every_replica_current() -> None:
    """Lossless, a round sends the snapshot's meta alone (no edge could need its
    images), and a replica behind it is the plane's own bug: it stops the run."""
    config = SimConfig(TOY, seed=4, update_delay_ms=20.0, resync=True, snapshot_every_s=0.5)
    sim = Simulation(config)
    (replica,) = sim.index.replicas
    checked: list[SnapshotMeta] = []
    # The replica's class is compiled (its methods cannot be replaced): its followers'
    # comparisons are what a round asks of it.
    for follower in replica.followers:
        compare = follower.compare

        def counted(
            meta: SnapshotMeta, compare: Callable[..., SnapshotCheck] = compare
        ) -> SnapshotCheck:
            checked.append(meta)
            return compare(meta)

        follower.compare = counted  # type: ignore[method-assign]
    assert sim.run(REQUESTS, settle_s=1.0).stats["index_divergent_tables"] == 0
    assert len({meta.created_ns for meta in checked}) >= 2  # rounds, each every shard
    current = sim.index.writers[0].snapshot_meta()
    replica.confirm_current(current)
    with pytest.raises(InvariantBroken, match="lossless edge replica is behind"):
        replica.confirm_current(dataclasses.replace(current, next_seq=current.next_seq + 1))


def test_a_view_that_differs_from_its_writer_by_one_byte_is_counted() -> None:
    sim = simulation(0.0)
    assert sim.index.divergent_tables() == 0
    (replica,) = sim.index.replicas
    view = replica._views[(0, 0)]
    view._buf[view._layout.view_end - 1] ^= 1  # the last byte of the payload
    assert sim.index.divergent_tables() == 1
