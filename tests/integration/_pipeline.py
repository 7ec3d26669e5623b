"""The test cluster: a LocalCluster plus publishers and a reference model of the events."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from subprocess import Popen

import numpy as np

from kvcompass.index import LudoTable
from kvcompass.index.image import HEADER_SIZE, ImageHeader
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.keys import Namespace, shard_of
from kvcompass.levels import plan_levels
from kvcompass.loadgen.testing import LocalCluster
from kvcompass.publisher import EventPublisher
from kvcompass.shm import SharedIndexReader
from kvcompass.topology import load_topology
from kvcompass.wire import EventKind, KVEventBatch

N_SHARDS = 3
NS = Namespace("itest-model")

# The testbed topology with 16 fingerprint bits, so absent keys read 0 at the edge too.
TOPOLOGY_TOML = Path(__file__).parent / "testbed-fp16.toml"


class Cluster(LocalCluster):
    """Everything one test needs, isolated from other tests by unique names."""

    def __init__(
        self,
        kafka_bootstrap: str,
        redis_url: str,
        log_dir: Path,
        initial_capacity: int = 64,
        shards: int = N_SHARDS,
    ) -> None:
        """``initial_capacity``: small by default, so tables grow during the tests."""
        super().__init__(
            kafka_bootstrap,
            redis_url,
            log_dir,
            shards=shards,
            topology=str(TOPOLOGY_TOML),
            initial_capacity=initial_capacity,
        )
        self.topology = load_topology(TOPOLOGY_TOML)
        self.layout = IndexLayout.from_topology(self.topology)
        self.plan = plan_levels(self.topology)
        self.reference: dict[tuple[int, int], dict[int, int]] = {}
        self.publishers = {
            w.id: EventPublisher(w, self.plan, NS, shards, self.send) for w in self.topology.workers
        }
        #: Every event batch sent, as (shard, encoded batch), in send order.
        self.sent: list[tuple[int, bytes]] = []

    def send(self, shard: int, data: bytes) -> None:
        self.sent.append((shard, data))
        super().send(shard, data)

    def redeliver(self, batches: list[tuple[int, bytes]]) -> None:
        """Send batches again, as an at-least-once sender does after a lost ack: the same
        bytes (same worker, incarnation and seq), now after later batches of their worker.
        The reference is unchanged: the maintenance units must drop every copy."""
        for shard, data in batches:
            super().send(shard, data)
        self.producer.flush(30)

    # -- events and the reference ------------------------------------------------------

    def publish(self, worker_id: str, kind: EventKind, tokens: np.ndarray, tier: Tier) -> None:
        batches = self.publishers[worker_id].publish(kind, tokens, tier)
        self._record(worker_id, batches)
        self.producer.poll(0)

    def _record(self, worker_id: str, batches: Iterable[KVEventBatch]) -> None:
        worker = self.topology.worker(worker_id)
        table_id, _ = self.layout.slots[worker.index]
        for batch in batches:
            for event in batch.events:
                for _, key in event.keys:
                    holders = self.reference.setdefault((table_id, key), {})
                    if event.kind == EventKind.EVICT:
                        holders.pop(worker.index, None)
                    else:
                        holders[worker.index] = int(event.tier)

    def random_traffic(
        self, rng: np.random.Generator, n_events: int, prompts: list[np.ndarray]
    ) -> None:
        """Admits, tier changes and evictions by random workers of random prompts."""
        workers = [w.id for w in self.topology.workers]
        for _ in range(n_events):
            worker = workers[int(rng.integers(len(workers)))]
            prompt = prompts[int(rng.integers(len(prompts)))]
            roll = rng.random()
            if roll < 0.55:
                self.publish(worker, EventKind.ADMIT, prompt, Tier.VRAM)
            elif roll < 0.8:
                self.publish(worker, EventKind.TIER, prompt, Tier.DRAM)
            else:
                self.publish(worker, EventKind.EVICT, prompt, Tier.ABSENT)
        self.producer.flush(30)

    def expected(self, table_id: int, key: int) -> int:
        value = 0
        for worker, tier in self.reference.get((table_id, key), {}).items():
            value |= tier << (2 * self.layout.slots[worker][1])
        return value

    # -- checks ------------------------------------------------------------------------

    def finish(self, mu_procs: list[Popen[bytes]], edge: Popen[bytes]) -> int:
        """Drain the MUs (SIGTERM: final snapshots), wait for the edge, compare everything.
        Returns the keys checked."""
        self.wait_mu_caught_up()
        for proc in mu_procs:
            assert self.stop(proc) == 0, "maintenance unit did not drain cleanly"
        self.wait_edge_at(self.snapshot_positions())
        checked = self.assert_edge_matches()
        assert self.stop(edge) == 0
        return checked

    def assert_edge_matches(self) -> int:
        """Edge views equal the MU's final snapshot byte for byte, and both equal the
        reference model for every key the events touched. Returns keys checked."""
        reader = SharedIndexReader(self.shm_prefix)
        try:
            checked = 0
            for shard in range(self.shards):
                snap = self.store.load(shard)
                assert snap is not None
                for table_id, image in snap.views.items():
                    edge = reader.image(shard, table_id)
                    assert ImageHeader.unpack(edge).geometry == ImageHeader.unpack(image).geometry
                    assert edge[HEADER_SIZE:] == image[HEADER_SIZE:], (shard, table_id)
                tables = {t: LudoTable.from_parts(snap.views[t], snap.keys[t]) for t in snap.views}
                for table_id, key in self.reference:
                    if shard_of(key, self.shards) != shard:
                        continue
                    want = self.expected(table_id, key)
                    assert tables[table_id].get(key) == want, (shard, table_id, key)
                    if want:
                        assert reader.lookup(shard, table_id, key) == want
                    checked += 1
            return checked
        finally:
            reader.close()


def prompts(rng: np.random.Generator, n: int, shared_prefix: int = 2048) -> list[np.ndarray]:
    """Prompts in families sharing a system prompt, long enough to reach remote levels."""
    families = [rng.integers(0, 60_000, shared_prefix, dtype=np.uint32) for _ in range(8)]
    out = []
    for i in range(n):
        tail = rng.integers(0, 60_000, int(rng.integers(200, 5000)), dtype=np.uint32)
        out.append(np.concatenate([families[i % len(families)], tail]))
    return out
