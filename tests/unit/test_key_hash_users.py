"""Every key user follows the topology's ``[index] key_hash``: what a worker publishes is
what an edge queries, under either hash, and the two hashes never share keys."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvcompass.index.discovery import QueryPlanner
from kvcompass.index.layout import Tier
from kvcompass.keys import KeyHash, Namespace, prefix_keys
from kvcompass.levels import plan_levels
from kvcompass.pipeline.clock import ManualClock
from kvcompass.publisher import EventPublisher
from kvcompass.topology import Topology, load_builtin

NS = Namespace("hash-users-model")
TESTBED = load_builtin("testbed-3region")


def with_hash(key_hash: KeyHash) -> Topology:
    return replace(TESTBED, index=replace(TESTBED.index, key_hash=key_hash))


def published(topology: Topology, worker: int, tokens: np.ndarray) -> dict[int, int]:
    """(length -> key) of one admit, as the worker's publisher sends it."""
    publisher = EventPublisher(
        topology.workers[worker],
        plan_levels(topology),
        NS,
        4,
        lambda shard, data: None,
        clock=ManualClock(),
    )
    batches = publisher.admit(tokens, Tier.VRAM)
    return {
        int(c): int(k)
        for b in batches
        for c, k in zip(b.length_array.tolist(), b.key_array.tolist(), strict=True)
    }


@pytest.mark.parametrize("key_hash", list(KeyHash), ids=str)
def test_publisher_and_query_planner_use_the_topology_hash(key_hash: KeyHash) -> None:
    topology = with_hash(key_hash)
    tokens = np.random.default_rng(2).integers(0, 128_000, 6000, dtype=np.uint32)
    sent = published(topology, 0, tokens)  # us-0
    assert sent == prefix_keys(tokens, sent, NS, key_hash)
    for edge in ("us", "eu", "asia"):
        query = QueryPlanner(plan_levels(topology), edge, NS).query(tokens)
        for length, key in query.per_region["us"]:
            assert sent[length] == key, (edge, length)


def test_the_two_hashes_publish_disjoint_keys() -> None:
    tokens = np.random.default_rng(3).integers(0, 128_000, 6000, dtype=np.uint32)
    sha = published(with_hash(KeyHash.SHA256), 0, tokens)
    xxh = published(with_hash(KeyHash.XXH3), 0, tokens)
    assert set(sha) == set(xxh)
    assert not set(sha.values()) & set(xxh.values())
