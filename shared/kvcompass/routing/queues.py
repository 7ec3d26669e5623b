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

:class:`QueueEstimates` keeps them, compiled (``queue_estimates.pyx``: an edge folds
every region's vector every local period); :class:`QueueReporter` is the sender's half:
which regions a region's broadcast goes to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from mypy_extensions import mypyc_attr

from kvcompass.pipeline.clock import Clock
from kvcompass.routing.policy import Decision, Feedback, RegionQueues
from kvcompass.routing.queue_estimates import QueueEstimates
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


# Compiled by mypyc (pyproject), with KVCompassPolicy; the baselines subclass it in Python.
@mypyc_attr(allow_interpreted_subclasses=True)
class QueueFed:
    """A policy's feedback hooks, all of which land in its edge's queue estimates: the
    vector a response piggybacks, the broadcast, the work it forwards, a failed worker.
    KVCompass and every baseline keep the same estimates (subclasses set ``queues``)."""

    queues: QueueEstimates

    def observe(self, feedback: Feedback) -> None:
        # apply(queues, piggybacked), positional: about two per request in the simulator
        vector = feedback.queue_vector
        if vector is not None:
            self.queues.apply(vector, feedback.cross_region)

    def on_queues(self, queues: RegionQueues) -> None:
        self.queues.apply(queues, False)

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
        self._own = (region,)
        # Last time each other region got our vector, by broadcast or piggyback.
        self._last: dict[str, float] = dict.fromkeys(self._others, -math.inf)
        # At most the earliest of them (only piggybacks move one since, and only later).
        self._earliest = -math.inf

    def note_piggyback(self, region: str) -> None:
        """A response carrying this region's vector is on its way to ``region``."""
        if region in self._last:
            self._last[region] = self._clock.monotonic()

    def destinations(self) -> tuple[str, ...]:
        """Regions this period's vector goes to: the own region first, then those due."""
        now = self._clock.monotonic()
        # Most periods send to no other region. Subtraction keeps order, so when the
        # earliest is not due none is, by the same comparison as below.
        if now - self._earliest < self.period_s:
            return self._own
        due = [r for r in self._others if now - self._last[r] >= self.period_s]
        for r in due:
            self._last[r] = now
        self._earliest = min(self._last.values(), default=math.inf)
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
