"""Queue estimates T̂q(r) (paper §3.4): what an edge believes every worker's queue to be.

An edge sees its own region's queues live (every response and every local vector on
``kvc.queues`` carries them) and other regions' through two channels: the vector a
cross-region response piggybacks, folded in with an EWMA of weight w, and the region's
broadcast every Δ, which replaces the estimate (it is at most Δ old, so averaging it with
an older value would only add lag). Between two reports the edge adds the work it
forwarded itself (pending), or every decision until the next report would pick the same
idle worker. A report supersedes only the pending work that had reached the worker when
the report was sent (forward time + one-way latency, on the wall clock): a remote
region's broadcast sent while our request is still crossing the WAN does not include it.

:class:`QueueReporter` is the sender's half: which regions a region's broadcast goes to.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from kvcompass.pipeline.clock import Clock
from kvcompass.routing.policy import Decision, Feedback, RegionQueues
from kvcompass.topology import Topology
from kvcompass.wire import QueueVector

__all__ = [
    "QueueEstimates",
    "QueueFed",
    "QueueReporter",
    "Source",
    "from_vector",
    "queues_by_index",
    "to_vector",
]

#: Where a worker's current estimate last came from ("none": no report yet; "down": the
#: worker failed and no newer report has arrived; "pending": forwarded work on top of a report).
Source = Literal["none", "live", "piggyback", "broadcast", "pending", "down"]

_DOWN: Final = math.inf


class QueueEstimates:
    """Per worker (global index): estimate in ms, its source and its age.

    ``values`` is the live list the scorer reads: the last report (folded) plus pending.
    ``blocked`` is 0 per worker, or +inf while it is down: what a load-blind score adds,
    so that a failed worker is avoided even when queues are ignored.
    """

    def __init__(
        self, topology: Topology, origin_region: str, clock: Clock, piggyback_weight: float
    ) -> None:
        if not 0 < piggyback_weight <= 1:
            raise ValueError(f"piggyback weight must be in (0, 1], got {piggyback_weight}")
        topology.region_index(origin_region)  # KeyError for an unknown region
        n = len(topology.workers)
        now = clock.monotonic()
        self.origin_region = origin_region
        self.weight = piggyback_weight
        self.n_workers = n
        self._clock = clock
        self.values = [0.0] * n
        self.blocked = [0.0] * n
        self._reported = [0.0] * n
        self._pending = [0.0] * n
        # Per worker: (wall ns the work reaches it, ms), oldest first.
        self._in_flight: list[deque[tuple[int, float]]] = [deque() for _ in range(n)]
        self._one_way_ns = [
            round(topology.wan_ms(origin_region, w.region) * 1e6) for w in topology.workers
        ]
        self._source: list[Source] = ["none"] * n
        self._reported_at = [now] * n
        self._sent_ns = [-1] * n  # sender wall clock of the last applied report
        self._zero_since: list[float | None] = [now] * n

    def apply(self, queues: RegionQueues, piggybacked: bool) -> int:
        """Fold a region's vector in; returns how many workers it updated.

        Own region: live, replaces. Another region's: EWMA of weight w if it came on a
        response, replaces if broadcast. A worker's entry is skipped if this edge already
        applied a report sent at the same time or later (vectors overtake each other: a
        piggyback crosses the WAN, the broadcast the bus), or if its index is unknown.
        """
        if queues.region == self.origin_region:
            kind: Source = "live"
        else:
            kind = "piggyback" if piggybacked else "broadcast"
        now = self._clock.monotonic()
        sent = queues.sent_at_ns
        w = self.weight
        piggyback = kind == "piggyback"
        # Every region's vector reaches every edge every 20 ms, so this loop is hot: the
        # lists are locals, and a worker with no work in flight has nothing to supersede.
        # _set is written out below; ``not ms > 0.0`` clamps negatives and NaN to 0.
        n = self.n_workers
        sent_ns, source, reported = self._sent_ns, self._source, self._reported
        in_flight, pending = self._in_flight, self._pending
        reported_at, blocked = self._reported_at, self.blocked
        values, zero_since = self.values, self._zero_since
        applied = 0
        for worker, ms in queues.queue_ms.items():
            if not 0 <= worker < n or sent <= sent_ns[worker]:
                continue
            ms = float(ms)
            if not ms > 0.0:
                ms = 0.0
            if piggyback and source[worker] not in ("none", "down"):
                ms = reported[worker] + w * (ms - reported[worker])
            reported[worker] = ms
            if in_flight[worker]:  # else pending is 0 (an invariant of add_pending)
                self._supersede_pending(worker, sent)
                ms += pending[worker]
            source[worker] = kind
            reported_at[worker] = now
            sent_ns[worker] = sent
            blocked[worker] = 0.0
            values[worker] = ms
            if ms > 0.0:
                zero_since[worker] = None
            elif zero_since[worker] is None:
                zero_since[worker] = now
            applied += 1
        return applied

    def _supersede_pending(self, worker: int, sent_at_ns: int) -> None:
        """Drop the forwarded work a report sent at ``sent_at_ns`` already counts."""
        flight = self._in_flight[worker]
        while flight and flight[0][0] <= sent_at_ns:
            flight.popleft()
        self._pending[worker] = sum(ms for _, ms in flight) if flight else 0.0

    def add_pending(self, worker: int, ms: float) -> None:
        """Work this edge just forwarded to ``worker``, counted until its next report."""
        if ms <= 0 or self._source[worker] == "down":
            return
        self._in_flight[worker].append((self._clock.wall_ns() + self._one_way_ns[worker], ms))
        self._pending[worker] += ms
        self._set(worker, self._reported[worker] + self._pending[worker], self._clock.monotonic())

    def mark_down(self, worker: int) -> None:
        """The worker failed: infinitely busy until a report sent after now arrives."""
        self._source[worker] = "down"
        self._pending[worker] = 0.0
        self._in_flight[worker].clear()
        self._sent_ns[worker] = max(self._sent_ns[worker], self._clock.wall_ns())
        self.blocked[worker] = _DOWN
        self._set(worker, _DOWN, self._clock.monotonic())

    def _set(self, worker: int, value: float, now: float) -> None:
        self.values[worker] = value
        if value > 0.0:
            self._zero_since[worker] = None
        elif self._zero_since[worker] is None:
            self._zero_since[worker] = now

    def source(self, worker: int) -> Source:
        src = self._source[worker]
        return "pending" if self._pending[worker] > 0 and src != "down" else src

    def age_s(self, worker: int) -> float:
        """Seconds since this edge applied the last report about ``worker``."""
        return self._clock.monotonic() - self._reported_at[worker]

    def idle_for_s(self, worker: int) -> float:
        """How long the estimate has been exactly 0 (-inf while it is not)."""
        since = self._zero_since[worker]
        return -math.inf if since is None else self._clock.monotonic() - since


class QueueFed:
    """A policy's feedback hooks, all of which land in its edge's queue estimates: the
    vector a response piggybacks, the broadcast, the work it forwards, a failed worker.
    KVCompass and every baseline keep the same estimates (subclasses set ``queues``)."""

    queues: QueueEstimates

    def observe(self, feedback: Feedback) -> None:
        if feedback.queue_vector is not None:
            self.queues.apply(feedback.queue_vector, piggybacked=feedback.cross_region)

    def on_queues(self, queues: RegionQueues) -> None:
        self.queues.apply(queues, piggybacked=False)

    def on_forward(self, decision: Decision, expected_service_ms: float) -> None:
        self.queues.add_pending(decision.worker, expected_service_ms)

    def on_failure(self, worker: int) -> None:
        self.queues.mark_down(worker)


class QueueReporter:
    """The sender-side rule for a region's queue broadcasts on ``kvc.queues``.

    Call :meth:`destinations` every local period (the own region's edges want live
    queues); it always names the own region and names each other region once per Δ,
    unless a response carrying the vector reached that region within Δ
    (:meth:`note_piggyback`): that pair is already fresh, so the broadcast is suppressed.
    """

    def __init__(self, region: str, regions: Sequence[str], clock: Clock, period_s: float) -> None:
        if region not in regions:
            raise ValueError(f"region {region!r} is not one of {list(regions)}")
        if period_s <= 0:
            raise ValueError(f"broadcast period must be positive, got {period_s}")
        self.region = region
        self.period_s = period_s
        self._clock = clock
        self._others = tuple(r for r in regions if r != region)
        # Last time each other region got our vector, by broadcast or piggyback.
        self._last: dict[str, float] = dict.fromkeys(self._others, -math.inf)

    def note_piggyback(self, region: str) -> None:
        """A response carrying this region's vector is on its way to ``region``."""
        if region in self._last:
            self._last[region] = self._clock.monotonic()

    def destinations(self) -> tuple[str, ...]:
        """Regions this period's vector goes to: the own region first, then those due."""
        now = self._clock.monotonic()
        due = [r for r in self._others if now - self._last[r] >= self.period_s]
        for r in due:
            self._last[r] = now
        return (self.region, *due)


def queues_by_index(
    topology: Topology, region: str, seq: int, sent_at_ns: int, queue_ms: Mapping[str, float]
) -> RegionQueues:
    """A response's ``kvc.queues`` (keyed by worker id) as :class:`RegionQueues`.

    Raises KeyError naming an unknown worker id.
    """
    return RegionQueues(
        region, seq, sent_at_ns, {topology.worker(w).index: float(ms) for w, ms in queue_ms.items()}
    )


def from_vector(vector: QueueVector) -> RegionQueues:
    return RegionQueues(vector.region, vector.seq, vector.sent_at_ns, dict(vector.queues))


def to_vector(queues: RegionQueues, to: Iterable[str] = ()) -> QueueVector:
    return QueueVector(
        region=queues.region,
        sent_at_ns=queues.sent_at_ns,
        seq=queues.seq,
        queues=tuple(sorted(queues.queue_ms.items())),
        to=tuple(to),
    )
