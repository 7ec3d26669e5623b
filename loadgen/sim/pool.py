"""The simulated workers: one real emulated engine, prefix cache and event publisher each.

Each worker is what ``services/worker`` hosts, minus HTTP and Kafka: the cache reports
its changes to an :class:`EventPublisher` that buffers them, and after every engine
step the buffered events go out as one batch per shard, to the index's writers. The
pool is also the :class:`~kvcompass.routing.world.WorldView` a policy may read: each
worker's exact queue now.
"""

from __future__ import annotations

from kvcompass.frozen_init import field_builder
from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.levels import LevelPlan
from kvcompass.loadgen.sim.index import IndexPlane
from kvcompass.publisher import EventPublisher
from kvcompass.routing import RegionQueues
from kvcompass.topology import Topology, Worker
from kvcompass.virtual_time import VirtualClock
from kvcompass.worker import (
    CostModel,
    EmulatedEngine,
    EvictionPolicy,
    PrefixCache,
    PrefixChange,
)
from kvcompass.worker.engine import queue_vector

__all__ = ["SimWorker", "WorkerPool"]

#: Buffer every change until the step ends (as WorkerNode does): one batch per shard.
_BUFFER_KEYS = 1 << 30
#: A region's vector, built without the type call (about two per request).
_new_vector = field_builder(RegionQueues)


class SimWorker:
    def __init__(
        self,
        worker: Worker,
        topology: Topology,
        plan: LevelPlan,
        eviction: EvictionPolicy,
        clock: VirtualClock,
        index: IndexPlane,
        incarnation: int,
    ) -> None:
        self.worker = worker
        self.publisher = EventPublisher(
            worker,
            plan,
            Namespace(topology.model.name),
            index.n_shards,
            None,  # no transport: the batch objects go to the writers as they are
            max_buffered_keys=_BUFFER_KEYS,
            incarnation=incarnation,
            clock=clock,
        )
        cache = PrefixCache.for_worker(topology, worker, eviction, self._on_change)
        cost = CostModel.for_worker(topology, worker)
        # The simulator reads first and last tokens only (TTFT, end to end).
        self.engine = EmulatedEngine(cache, cost, clock, stream=False)
        self._index = index
        #: The cache changed since the last :meth:`publish` (most engine steps change
        #: nothing).
        self._changed = False
        #: Reload + prefill ms of requests whose prefill ended since the last sample.
        self.busy_ms = 0.0
        #: Time of the wake-up event scheduled for this worker (None: none).
        self.wake_at: float | None = None
        #: False: the cache's changes are discarded where they would be sent, and the
        #: index never learns them (the simulator's floor in bench/sim.py).
        self.sends = True

    def _on_change(self, change: PrefixChange) -> None:
        self.publisher.publish(
            change.kind,
            change.tokens,
            change.tier,
            namespace=change.namespace,
            lengths=change.lengths,
        )
        self._changed = True

    def publish(self) -> None:
        """Send what the cache changed since the last call to the index."""
        if self._changed:
            self._changed = False
            if not self.sends:
                self.publisher.discard()
                return
            for batch in self.publisher.flush():
                self._index.send(batch.shard, batch)

    def blocks(self, tier: Tier) -> int:
        return self.engine.cache.blocks(tier)


class WorkerPool:
    """Every worker of the topology, by global index."""

    def __init__(
        self,
        topology: Topology,
        plan: LevelPlan,
        eviction: EvictionPolicy,
        clock: VirtualClock,
        index: IndexPlane,
        seed: int,
    ) -> None:
        self.workers = [
            SimWorker(w, topology, plan, eviction, clock, index, incarnation=seed * 4096 + w.index)
            for w in topology.workers
        ]
        self._clock = clock
        by_region: dict[str, list[SimWorker]] = {}
        for w in self.workers:
            by_region.setdefault(w.worker.region, []).append(w)
        # Per region: its workers' indices and engines, resolved once (a vector is built
        # per response and per broadcast).
        self._reporting = {
            region: (tuple(w.worker.index for w in ws), tuple(w.engine for w in ws))
            for region, ws in by_region.items()
        }
        self._seq = dict.fromkeys(by_region, 0)

    def queue_ms(self, worker: int) -> float:
        """WorldView: the worker's exact queue now."""
        return self.workers[worker].engine.queue_ms()

    def vector(self, region: str) -> RegionQueues:
        """The region's queue vector now, as its workers' host sends it."""
        seq = self._seq[region]
        self._seq[region] = seq + 1
        return _new_vector(
            region, seq, self._clock.wall_ns(), queue_vector(*self._reporting[region])
        )
