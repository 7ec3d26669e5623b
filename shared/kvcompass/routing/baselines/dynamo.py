"""Dynamo-style router: a KV-aware router per region over a periodically refreshed global view.

Model: the origin region's router prices every worker of the pool in KV blocks, NVIDIA
Dynamo's KV-router cost: prefill blocks left after overlap credit plus decode blocks,
lowest wins (ties: local first, then lower index). Prefill blocks = the worker's queued
prefill work in blocks (queue ms ÷ (β·block)) + the prompt's blocks − the overlap credit
(matched blocks from the index, credited 1.0 in VRAM and 0.75 in DRAM, Dynamo's device /
host defaults), floored at 0. Decode blocks = the blocks of requests this router sent to
the worker that have not answered yet (Dynamo tracks active blocks from the requests it
routes). The global view: the router's own region's queues are live; other regions' are a
snapshot taken every ``RoutingConfig.broadcast_period_s`` (Δ = 100 ms) and frozen in
between, so requests decided between two refreshes all see the same remote queues (the
staleness §5.2 blames). Paper: §5.1 baseline (6), "a KV cache-aware dynamo router
implemented by Nvidia on each region and periodically broadcasts to get the global view".
Assumptions: the snapshot is this edge's queue estimates at refresh time (the broadcasts
it has received, plus work it forwarded); WAN is not in the cost (Dynamo's router has no
network term); a response frees the oldest request this router sent to that worker (FIFO:
the response does not say which request it answers); no softmax sampling (temperature 0).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import compress

from kvcompass.index.layout import Tier
from kvcompass.index.reader import IndexReader
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import IndexedBaseline, Route
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import Decision, Feedback, RouteRequest
from kvcompass.topology import Topology

__all__ = ["DynamoRouter"]

#: Overlap credit per matched block by tier (Dynamo's device / host defaults).
CREDIT = {int(Tier.VRAM): 1.0, int(Tier.DRAM): 0.75}


class DynamoRouter(IndexedBaseline):
    name = "dynamo"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        reader: IndexReader,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
    ) -> None:
        super().__init__(topology, origin_region, reader, plan, config, clock)
        self.block = topology.index.block_size
        self._ms_per_block = [w.beta_ms_per_token * self.block for w in topology.workers]
        self._remote = [w.region != origin_region for w in topology.workers]
        # A stable sort over this order breaks cost ties local first, then by lower index.
        self._tie_order = sorted(range(self.n_workers), key=lambda w: (self._remote[w], w))
        self.view = [0.0] * self.n_workers
        self._refreshed = -math.inf
        self.decode_blocks = [0] * self.n_workers
        self._in_flight: list[deque[int]] = [deque() for _ in range(self.n_workers)]
        self._last_blocks = 0

    def seen_queues(self, explain: bool = False) -> list[float]:
        """Queue ms as the router sees them: its own region's live, the others' as of the
        last refresh, taken anew once Δ has passed (not kept by an explaining dry run)."""
        live, remote = self.queues.values, self._remote
        now = self.clock.monotonic()
        view = self.view
        if now - self._refreshed >= self.config.broadcast_period_s:
            view = list(live)
            if not explain:
                self.view, self._refreshed = view, now
        return [view[w] if remote[w] else live[w] for w in range(self.n_workers)]

    def costs(
        self, prompt: int, lengths: Sequence[int], tiers: Sequence[int], queues: Sequence[float]
    ) -> list[float]:
        """Each worker's cost in blocks: prefill left after overlap credit, plus decode."""
        block = self.block
        blocks = math.ceil(prompt / block)
        prefill = [q / m + blocks for q, m in zip(queues, self._ms_per_block, strict=True)]
        for w in compress(range(self.n_workers), lengths):  # holders only
            overlap = CREDIT.get(tiers[w], 0.0) * (min(lengths[w], prompt) // block)
            prefill[w] = max(0.0, prefill[w] - overlap)
        return [p + d for p, d in zip(prefill, self.decode_blocks, strict=True)]

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        lengths, tiers = self.match(request)
        queues = self.seen_queues(explain)
        costs = self.costs(prompt, lengths, tiers, queues)
        order = sorted(self._tie_order, key=costs.__getitem__)
        if not explain:
            self._last_blocks = math.ceil(prompt / self.block)
        return Route(order, "kv-cost", lengths, tiers, queues=queues)

    def on_forward(self, decision: Decision, expected_service_ms: float) -> None:
        super().on_forward(decision, expected_service_ms)
        w = decision.worker
        self._in_flight[w].append(self._last_blocks)
        self.decode_blocks[w] += self._last_blocks

    def observe(self, feedback: Feedback) -> None:
        super().observe(feedback)
        flight = self._in_flight[feedback.worker]
        if flight:
            self.decode_blocks[feedback.worker] -= flight.popleft()

    def on_failure(self, worker: int) -> None:
        super().on_failure(worker)
        self.decode_blocks[worker] = 0
        self._in_flight[worker].clear()
