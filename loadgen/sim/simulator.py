"""The event loop: requests through edges, the WAN and workers, on virtual time.

One event per state change: an arrival at its origin's edge (the policy decides), the
request reaching its worker (lookup time and one WAN crossing later), the worker's
engine reaching its next due time (``next_event_at``), a response's report reaching the
edge (belief and piggybacked queues), queue vectors (every region's own edges every
``local_period_s``; other regions every Δ unless a response already carried the vector,
:class:`QueueReporter`), the index's flushes, patch deliveries and snapshots
(:mod:`.index`), and load samples. A request pays its WAN one-way delay out and the
same path back, the round trip the joint score assumes, plus ``Decision.lookup_ms``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kvcompass.frozen_init import field_builder
from kvcompass.keys import Namespace
from kvcompass.levels import plan_levels
from kvcompass.loadgen.sim.config import SimConfig
from kvcompass.loadgen.sim.index import IndexPlane
from kvcompass.loadgen.sim.pool import SimWorker, WorkerPool
from kvcompass.loadgen.sim.records import LoadSample, SimRecord, SimResult
from kvcompass.loadgen.workloads import LiveRequest
from kvcompass.loadgen.workloads.draws import TOKEN_TYPECODE
from kvcompass.routing import (
    Decision,
    Feedback,
    MigrationOrder,
    QueueReporter,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)
from kvcompass.virtual_time import EventQueue, VirtualClock
from kvcompass.worker import Emitted, MigrationMode, Request, Sequence

__all__ = ["Progress", "Simulation", "simulate"]

#: Called with the simulated time now, once per load sample.
Progress = Callable[[float], None]

# A request's values, built valid here (every field given): made without the type call
# and __init__, several times per request.
_new_route_request = field_builder(RouteRequest)
_new_feedback = field_builder(Feedback)
_new_record = field_builder(SimRecord)


class _Flight:
    """A request between its arrival and its last token back at the edge (``back_ms``
    and ``first_at`` are set at its first token)."""

    __slots__ = ("arrival", "back_ms", "decision", "first_at", "out_ms", "request", "tokens")

    def __init__(
        self,
        request: LiveRequest,
        tokens: array[int],
        decision: Decision,
        arrival: float,
        out_ms: float,
    ) -> None:
        self.request = request
        self.tokens = tokens
        self.decision = decision
        self.arrival = arrival
        self.out_ms = out_ms
        self.back_ms = 0.0
        self.first_at = math.nan


class Simulation:
    """One run's state; :func:`simulate` builds it and runs it to the end."""

    def __init__(self, config: SimConfig, progress: Progress | None = None) -> None:
        self.config = config
        topology = config.topology
        self.topology = topology
        self.clock = VirtualClock()
        self.events = EventQueue()
        self._rng = random.Random(config.seed)
        plan = plan_levels(topology)
        self.index = IndexPlane(
            topology,
            config.shards,
            self.clock,
            self.events,
            flush_ms=config.flush_ms,
            update_delay_ms=config.update_delay_ms,
            update_loss=config.update_loss,
            resync=config.resync,
            snapshot_every_s=config.snapshot_every_s,
            seed=config.seed,
        )
        self.pool = WorkerPool(topology, plan, config.eviction, self.clock, self.index, config.seed)
        regions = [r.name for r in topology.regions]
        self.policies: dict[str, RoutingPolicy] = {
            r: make_policy(
                config.policy,
                topology,
                r,
                self.index.edges[r],
                config=config.routing,
                clock=self.clock,
                plan=plan,
                seed=config.seed * 1009 + i,
                world=self.pool,
            )
            for i, r in enumerate(regions)
        }
        self.reporters = {
            r: QueueReporter(r, regions, self.clock, config.routing.broadcast_period_s)
            for r in regions
        }
        # Per origin, per destination (no pair tuple to build and hash per crossing).
        self._one_way = {a: {b: topology.wan_ms(a, b) for b in regions} for a in regions}
        self._region_of = [w.region for w in topology.workers]
        self._jitter = config.jitter_pct / 100.0
        self._namespaces: dict[str, Namespace] = {}
        self._model = topology.model.name
        # By the engine's sequence (eq=False: hashed by identity, no key tuple per lookup).
        self._flights: dict[Sequence, _Flight] = {}
        self._pending = 0
        self._migrations = 0  # orders issued (an ablation that changes nothing shows 0)
        self._arrivals: Iterator[LiveRequest] = iter(())
        self._progress = progress
        self.records: list[SimRecord] = []
        self.samples: list[LoadSample] = []

    # -- running ---------------------------------------------------------------------

    def run(self, requests: Iterable[LiveRequest], settle_s: float = 0.0) -> SimResult:
        """Run until every request finished, then ``settle_s`` more simulated seconds
        (patches in flight land, anti-entropy runs) before the index is compared."""
        started = time.perf_counter()
        with _few_collections():
            self._loop(requests, settle_s)
        stats: dict[str, Any] = dict(self.index.stats())
        stats["index_divergent_tables"] = self.index.divergent_tables()
        stats["simulated_s"] = self.clock.monotonic()
        stats["n_workers"] = len(self.pool.workers)
        stats["migrations"] = self._migrations
        return SimResult(
            self.records, self.samples, self.config.as_dict(), time.perf_counter() - started, stats
        )

    def _loop(self, requests: Iterable[LiveRequest], settle_s: float) -> None:
        limit = self.config.time_limit_s
        self._arrivals = iter(requests) if limit is None else self._before(requests, limit)
        self._next_arrival()
        self.events.push(0.0, self._broadcast)
        self.events.push(self.config.sample_every_s, self._sample)
        if self._pending or self._arrival_queued:
            self.events.run(self.clock)  # until the last response is back (_feedback)
        self.events.run(self.clock, until=self.clock.monotonic() + settle_s)

    @staticmethod
    def _before(requests: Iterable[LiveRequest], limit: float) -> Iterator[LiveRequest]:
        for r in requests:
            if r.at_s >= limit:
                return
            yield r

    def _next_arrival(self) -> None:
        request = next(self._arrivals, None)
        self._arrival_queued = request is not None
        if request is not None:
            self.events.push(request.at_s, self._arrive, request)

    def _wan(self, a: str, b: str) -> float:
        """One crossing from region a to b (ms), with the configured jitter."""
        base = self._one_way[a][b]
        if self._jitter:
            return base * (1.0 + self._jitter * (2.0 * self._rng.random() - 1.0))
        return base

    # -- a request's path ------------------------------------------------------------

    def _arrive(self, request: LiveRequest) -> None:
        self._next_arrival()
        namespace = self._namespaces.get(request.tenant)
        if namespace is None:
            namespace = self._namespaces[request.tenant] = Namespace(self._model, request.tenant)
        # The workloads' array('I') goes on as it is (every reader takes a uint32 buffer;
        # a numpy view of it cost ~2 µs a request, cold); anything else is converted
        # (array does it in C, ~3x numpy's asarray: 30 µs for a Mixed prompt).
        tokens = request.tokens
        if type(tokens) is not array or tokens.typecode != TOKEN_TYPECODE:
            tokens = array(TOKEN_TYPECODE, tokens)
        origin = request.origin_region
        policy = self.policies[origin]
        decision = policy.decide(_new_route_request(request.request_id, tokens, origin, namespace))
        policy.on_forward(decision, decision.expected_service_ms)
        out_ms = self._wan(origin, decision.region)
        flight = _Flight(request, tokens, decision, request.at_s, out_ms)
        self._pending += 1
        now = self.clock.monotonic()
        reach_ms = decision.lookup_ms + out_ms + self.config.serving_overhead_ms
        self.events.push(now + reach_ms / 1e3, self._submit, flight)
        order = decision.migration
        if order is not None:
            self._migrations += 1
            target = self._region_of[order.target_worker]
            reach = now + self._wan(origin, target) / 1e3
            self.events.push(reach, self._migrate, (namespace, tokens, order))

    def _submit(self, flight: _Flight) -> None:
        decision = flight.decision
        worker = self.pool.workers[decision.worker]
        request = flight.request
        namespace = self._namespaces[request.tenant]
        sequence = worker.engine.submit(
            Request(request.request_id, namespace, flight.tokens, request.max_tokens)
        )
        self._flights[sequence] = flight
        self._stepped(worker)

    def _migrate(self, arg: tuple[Namespace, array[int], MigrationOrder]) -> None:
        namespace, tokens, order = arg
        worker = self.pool.workers[order.target_worker]
        worker.engine.migrate(namespace, tokens[: order.prefix_tokens], MigrationMode(order.mode))
        self._stepped(worker)

    def _wake(self, worker: SimWorker) -> None:
        if worker.wake_at != self.clock.monotonic():
            return  # superseded by a later schedule
        worker.wake_at = None
        for emitted in worker.engine.advance():
            if emitted.index == 0:
                self._first_token(worker, emitted.sequence, emitted.at)
            if emitted.last:
                self._finish(worker, self._flights.pop(emitted.sequence), emitted)
        self._stepped(worker)

    def _stepped(self, worker: SimWorker) -> None:
        """After an engine change: publish its cache's changes, schedule its next event.

        Only first and last tokens matter here, so the worker wakes when one is due
        (or its cache changes); the plain decode steps between run in that advance."""
        worker.publish()
        due = worker.engine.next_notable_at()
        if due is not None and due != worker.wake_at:
            worker.wake_at = due
            self.events.push(due, self._wake, worker)

    def _first_token(self, worker: SimWorker, sequence: Sequence, at: float) -> None:
        worker.busy_ms += sequence.reload_ms + sequence.prefill_ms
        flight = self._flights[sequence]
        flight.first_at = at
        flight.back_ms = self._wan(worker.worker.region, flight.request.origin_region)

    def _finish(self, worker: SimWorker, flight: _Flight, emitted: Emitted) -> None:
        sequence, at = emitted.sequence, emitted.at
        decision, request = flight.decision, flight.request
        origin, region = request.origin_region, worker.worker.region
        timings = sequence.timings()
        back_s = flight.back_ms / 1e3
        ttft_ms = (flight.first_at + back_s - flight.arrival) * 1e3
        self.records.append(
            _new_record(
                request.request_id,
                request.session,
                request.tenant,
                origin,
                self.config.policy,
                worker.worker.id,
                region,
                flight.arrival,
                len(flight.tokens),
                sequence.generated,
                decision.claimed_tokens,
                sequence.reused.tokens,
                sequence.reused.dram_tokens,
                decision.lookup_ms,
                flight.out_ms + flight.back_ms,
                timings.queue,
                timings.prefill,
                timings.reload,
                ttft_ms,
                (at + back_s - flight.arrival) * 1e3,
                decision.reason,
                self.config.serving_overhead_ms,
                _expected_queue_ms(decision),
            )
        )
        # The last chunk carries the reuse report and the region's queues (piggybacked).
        vector = self.pool.vector(region)
        self.reporters[region].note_piggyback(origin)
        feedback = _new_feedback(
            decision.worker,
            decision.claimed_tokens,
            sequence.reused.tokens,
            vector,
            region != origin,
        )
        self.events.push(at + back_s, self._feedback, (origin, feedback))

    def _feedback(self, arg: tuple[str, Feedback]) -> None:
        origin, feedback = arg
        self.policies[origin].observe(feedback)
        self._pending -= 1
        if not self._pending and not self._arrival_queued:
            self.events.stop()

    # -- periodic --------------------------------------------------------------------

    def _broadcast(self, _: object) -> None:
        now = self.clock.monotonic()
        policies, push = self.policies, self.events.push
        for region, reporter in self.reporters.items():
            vector = self.pool.vector(region)
            for dest in reporter.destinations():
                reach = now + self._wan(region, dest) / 1e3
                # The edge's own method handles the delivery (8 per request on Mixed).
                push(reach, policies[dest].on_queues, vector)
        self.events.push(now + self.config.local_period_s, self._broadcast)

    def _sample(self, _: object) -> None:
        now = self.clock.monotonic()
        workers = self.pool.workers
        mean = sum(w.busy_ms for w in workers) / len(workers)
        for w in workers:
            # A window in which the pool computed nothing has no load factor (NaN), not
            # an even split: drawn as 1.0, the drain at a run's end read as balanced.
            factor = w.busy_ms / mean if mean > 0 else math.nan
            engine = w.engine
            self.samples.append(
                LoadSample(now, w.worker.id, engine.queue_ms(), engine.running, factor)
            )
            w.busy_ms = 0.0
        if self._progress is not None:
            self._progress(now)
        self.events.push(now + self.config.sample_every_s, self._sample)


def _expected_queue_ms(decision: Decision) -> float:
    """The queue term the policy scored for the worker it chose (NaN: it scored none)."""
    for candidate in decision.candidates:
        if candidate.worker == decision.worker:
            return candidate.queue_ms
    return math.nan


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """Collect cyclic garbage rarely while the simulation runs.

    The workers' caches hold hundreds of thousands of long-lived block objects, and each
    of Python's default full collections walks all of them: on Mixed that was a fifth of
    the run. Blocks are freed by reference counting when evicted (a removed block drops
    its parent link), so little waits for the collector. The thresholds are restored after.
    """
    before = gc.get_threshold()
    gc.set_threshold(100_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def simulate(
    config: SimConfig, requests: Iterable[LiveRequest], progress: Progress | None = None
) -> SimResult:
    """Run ``requests`` (in arrival order) through the simulated deployment of ``config``."""
    return Simulation(config, progress).run(requests)
