"""The real-time driver of one worker (no broker: the event batches go to a list)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kvcompass.keys import Namespace
from kvcompass.levels import plan_levels
from kvcompass.services.worker.metrics import WorkerMetrics
from kvcompass.services.worker.node import ScaledClock, WorkerNode
from kvcompass.topology import load_builtin
from kvcompass.wire import EventKind, KVEventBatch, decode
from kvcompass.worker import EvictionPolicy, Request

TOPOLOGY = load_builtin("testbed-3region")
NS = Namespace(TOPOLOGY.model.name, "t")


def node(sent: list[tuple[int, bytes]], scale: float) -> WorkerNode:
    return WorkerNode(
        TOPOLOGY.workers[0], TOPOLOGY, plan_levels(TOPOLOGY), policy=EvictionPolicy.LRU,
        clock=ScaledClock(scale), n_shards=4,
        send=lambda shard, data: sent.append((shard, data)),
        metrics=WorkerMetrics(CollectorRegistry()),
    )  # fmt: skip


def test_tokens_arrive_in_order_at_the_scaled_pace_and_events_are_sent() -> None:
    sent: list[tuple[int, bytes]] = []

    async def scenario() -> list[tuple[int, float, float]]:
        worker = node(sent, scale=0.01)
        driver = asyncio.create_task(worker.drive())
        prompt = np.arange(2000, dtype=np.uint32)  # 170 ms of prefill, 1.7 ms real
        sequence, queue = worker.submit(Request("r", NS, prompt, 20))
        tokens = worker.tokens(sequence, queue)
        received = [(e.index, e.at, worker.clock.monotonic()) async for e in tokens]
        driver.cancel()
        return received

    received = asyncio.run(scenario())
    assert [index for index, _, _ in received] == list(range(20))
    assert all(due <= seen for _, due, seen in received)  # never ahead of the timeline
    dues = [due for _, due, _ in received]
    assert np.diff(dues) == pytest.approx([0.009] * 19)  # one 9 ms step per token
    batches = [decode(data) for _, data in sent]
    assert all(isinstance(b, KVEventBatch) for b in batches)
    kinds = {e.kind for b in batches if isinstance(b, KVEventBatch) for e in b.events}
    assert kinds == {EventKind.ADMIT}
    assert len(sent) <= 4  # one batch per shard for the whole prompt


def test_reset_ends_a_waiting_request_and_sends_the_evicts() -> None:
    sent: list[tuple[int, bytes]] = []

    async def scenario() -> list[int]:
        worker = node(sent, scale=1.0)  # real time: the request is still decoding
        driver = asyncio.create_task(worker.drive())
        sequence, queue = worker.submit(Request("r", NS, np.arange(300, dtype=np.uint32), 500))
        worker.reset()
        indices = [e.index async for e in worker.tokens(sequence, queue)]
        driver.cancel()
        assert sequence.aborted
        return indices

    assert asyncio.run(scenario()) == []
    kinds = [
        e.kind for _, data in sent if isinstance(b := decode(data), KVEventBatch) for e in b.events
    ]
    assert EventKind.EVICT in kinds


def test_reannounce_is_a_new_incarnation_that_sends_the_whole_cache() -> None:
    sent: list[tuple[int, bytes]] = []
    worker = node(sent, scale=0.01)
    cache = worker.engine.cache
    for seed in range(3):
        cache.use(NS, np.random.default_rng(seed).integers(0, 1000, 3000, dtype=np.uint32))
    cache.load(NS, np.random.default_rng(9).integers(0, 1000, 2000, dtype=np.uint32))
    worker.publisher.flush()
    before = [decode(data, KVEventBatch) for _, data in sent]
    old = worker.publisher.incarnation
    sent.clear()
    assert worker.reannounce() == len(list(cache.held()))
    batches = [decode(data, KVEventBatch) for _, data in sent]
    # First an empty batch to each shard (every shard drops the old incarnation's
    # claims), then the state; one numbering, from 0, of one new incarnation.
    assert [(b.shard, b.n_keys) for b in batches[:4]] == [(s, 0) for s in range(4)]
    (new,) = {b.worker_incarnation for b in batches}
    assert new != old
    assert [b.worker_seq for b in batches] == list(range(len(batches)))

    def keys(batches: list[KVEventBatch], kind: EventKind) -> set[tuple[int, int, int]]:
        return {
            (length, key, int(e.tier))
            for b in batches
            for e in b.events
            if e.kind is kind
            for length, key in e.keys
        }

    assert keys(batches, EventKind.ADMIT) == keys(before, EventKind.ADMIT)
    assert {int(e.tier) for b in batches[4:] for e in b.events} == {
        1,
        2,
    }
