"""One hosted worker: the core's engine and cache, driven in real time on asyncio.

The engine never sleeps (``kvcompass.worker.engine``); :meth:`WorkerNode.drive` sleeps
until its next event or a submission, advances it, hands each emitted token to the
request waiting for it and sends the cache's changes as event batches. Time runs
``time_scale`` real seconds per emulated second (:class:`ScaledClock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.levels import LevelPlan
from kvcompass.publisher import EventPublisher, Send
from kvcompass.services.worker.metrics import WorkerMetrics
from kvcompass.topology import Topology, Worker
from kvcompass.worker import (
    CostModel,
    Emitted,
    EmulatedEngine,
    EvictionPolicy,
    MigrationMode,
    PrefixCache,
    PrefixChange,
    Request,
    Sequence,
)

__all__ = ["ScaledClock", "WorkerNode"]

#: Buffer the cache's changes and send them once per driver turn: one batch per shard
#: for everything a request changed (flush() sends them; this bound is never reached).
_BUFFER_KEYS = 1 << 30


class ScaledClock:
    """Emulated time: ``monotonic()`` advances 1/``scale`` s per real second; ``wall_ns``
    is real (it only stamps messages)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def monotonic(self) -> float:
        return time.monotonic() / self.scale

    def wall_ns(self) -> int:
        return time.time_ns()


class WorkerNode:
    """One emulated worker of the host process."""

    def __init__(
        self,
        worker: Worker,
        topology: Topology,
        plan: LevelPlan,
        *,
        policy: EvictionPolicy,
        clock: ScaledClock,
        n_shards: int,
        send: Send,
        metrics: WorkerMetrics,
    ) -> None:
        self.worker = worker
        self.clock = clock
        self.metrics = metrics
        self._new_publisher = functools.partial(
            EventPublisher,
            worker,
            plan,
            Namespace(topology.model.name),
            n_shards,
            send,
            max_buffered_keys=_BUFFER_KEYS,
            clock=clock,
        )
        self.publisher = self._new_publisher()
        cache = PrefixCache.for_worker(topology, worker, policy, self._on_change)
        self.engine = EmulatedEngine(cache, CostModel.for_worker(topology, worker), clock)
        self._waiting: dict[int, asyncio.Queue[Emitted | None]] = {}
        self._wake = asyncio.Event()

    # -- requests --------------------------------------------------------------------

    def submit(self, request: Request) -> tuple[Sequence, asyncio.Queue[Emitted | None]]:
        """Queue a completion; its tokens arrive on the returned queue (None: dropped)."""
        sequence = self.engine.submit(request)
        queue: asyncio.Queue[Emitted | None] = asyncio.Queue()
        self._waiting[sequence.number] = queue
        self._wake.set()
        return sequence, queue

    async def tokens(
        self, sequence: Sequence, queue: asyncio.Queue[Emitted | None]
    ) -> AsyncIterator[Emitted]:
        """The sequence's tokens as the engine emits them; stops early if it is dropped."""
        try:
            while (emitted := await queue.get()) is not None:
                yield emitted
                if emitted.last:
                    return
        finally:
            self._waiting.pop(sequence.number, None)

    def migrate(
        self, namespace: Namespace, tokens: NDArray[np.uint32], mode: MigrationMode
    ) -> None:
        self.engine.migrate(namespace, tokens, mode)
        self.metrics.migrations.labels(self.worker.id, mode.value).inc()
        self._wake.set()

    def reset(self, *, publish_evictions: bool = True) -> None:
        """Drop all work and evict everything (the evicts are buffered for the driver).

        ``publish_evictions=False`` loses them instead: fault injection for a worker
        whose cache emptied without the index hearing of it (stale claims).
        """
        for sequence in self.engine.reset():
            queue = self._waiting.get(sequence.number)
            if queue is not None:
                queue.put_nowait(None)
        if publish_evictions:
            self.publisher.flush()
        else:
            self.publisher.discard()

    def reannounce(self) -> int:
        """Tell the index the cache's whole state as a new incarnation; returns the
        prefixes sent. For when the broker lost its log: events it had acknowledged may
        never reach a maintenance unit, so the index cannot be trusted to hold what this
        worker told it. The new incarnation's announcement makes every shard drop what
        the earlier ones said; what follows is what the cache holds now."""
        self.publisher.discard()  # superseded by the state below
        self.publisher = self._new_publisher()
        self.publisher.announce()
        sent = 0
        for change in self.engine.cache.held():
            self._on_change(change)
            sent += 1
        self.publisher.flush()
        return sent

    def queue_ms(self) -> float:
        return self.engine.queue_ms()

    # -- the driver ------------------------------------------------------------------

    async def drive(self) -> None:
        """Advance the engine in real time until cancelled."""
        while True:
            self._wake.clear()
            for emitted in self.engine.advance():
                queue = self._waiting.get(emitted.sequence.number)
                if queue is not None:
                    queue.put_nowait(emitted)
            self.publisher.flush()
            self._observe()
            due = self.engine.next_event_at()
            timeout = None if due is None else max(due - self.clock.monotonic(), 0.0)
            if timeout is not None:
                timeout *= self.clock.scale
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _observe(self) -> None:
        worker = self.worker.id
        self.metrics.queue_ms.labels(worker).set(self.engine.queue_ms())
        self.metrics.running.labels(worker).set(self.engine.running)
        for tier in (Tier.VRAM, Tier.DRAM):
            blocks = self.engine.cache.blocks(tier)
            self.metrics.cache_blocks.labels(worker, tier.name.lower()).set(blocks)

    def _on_change(self, change: PrefixChange) -> None:
        self.publisher.publish(
            change.kind,
            change.tokens,
            change.tier,
            namespace=change.namespace,
            lengths=change.lengths,
        )
        self.metrics.events.labels(self.worker.id, change.kind.name.lower()).inc(
            len(change.lengths)
        )
