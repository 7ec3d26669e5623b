"""An emulated GPU inference engine: FCFS prefill, continuous-batching decode, one cache.

The engine is a discrete-event model that never sleeps: it changes state only in
:meth:`EmulatedEngine.submit`, :meth:`~EmulatedEngine.migrate` and
:meth:`~EmulatedEngine.advance`, and :meth:`~EmulatedEngine.next_event_at` says when the
next change is due. A real-time driver sleeps until then (or until a submission) and
calls ``advance``; the simulator sets its virtual clock to that time and calls it. Every
event is stamped with its own due time, not the time the driver woke up, so a late
driver delays delivery but never the emulated timeline.

Model (each duration from :class:`~kvcompass.worker.cost.CostModel`):

- one prefill at a time, in arrival order (the queue a router estimates). A request's
  reuse is looked up, and its prompt's blocks taken into VRAM, when its prefill starts:
  by then every earlier prompt is cached. Prefill lasts γ·(reused DRAM tokens) +
  β·(prompt − reused) and ends with the first output token.
- decode runs beside prefill (chunked prefill interleaves them on a real GPU; we do not
  model the interference). Sequences join the batch at step boundaries; each step emits
  one token per sequence and lasts the cost model's step time for the batch size.
- a migration by recompute is a prefill job in the same queue whose prompt lands in
  DRAM; a copy from a peer does not use the queue and lands when the copy ends.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from kvcompass.keys import Namespace
from kvcompass.pipeline.clock import Clock
from kvcompass.worker.cache import CacheMatch, PrefixCache
from kvcompass.worker.cost import CostModel

__all__ = [
    "Emitted",
    "EmulatedEngine",
    "MigrationMode",
    "Request",
    "Sequence",
    "Timings",
]


@dataclass(frozen=True, slots=True)
class Request:
    """A completion to compute: ``max_tokens`` (≥ 1) output tokens after the prompt."""

    request_id: str
    namespace: Namespace
    tokens: NDArray[np.uint32]
    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class Timings:
    """Where a completion's time went, in emulated milliseconds."""

    queue: float
    reload: float
    prefill: float
    decode: float
    ttft: float


#: Until its prefill starts, a sequence reuses nothing: one shared (frozen) match, not
#: one built per submit.
_NOTHING_REUSED = CacheMatch()


@dataclass(slots=True, eq=False)
class Sequence:
    """The engine's record of one request, filled in as it runs (times in clock seconds)."""

    number: int
    request: Request
    arrived_at: float
    expected_ms: float  # its prefill + reload as estimated at arrival (for queue_ms)
    reused: CacheMatch = _NOTHING_REUSED
    started_at: float | None = None
    reload_ms: float = 0.0
    prefill_ms: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    generated: int = 0
    aborted: bool = False

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.aborted

    def timings(self) -> Timings:
        """The durations so far (0 for what has not happened)."""
        started = self.started_at if self.started_at is not None else self.arrived_at
        first = self.first_token_at if self.first_token_at is not None else started
        end = self.finished_at if self.finished_at is not None else first
        return Timings(
            queue=(started - self.arrived_at) * 1e3,
            reload=self.reload_ms,
            prefill=self.prefill_ms,
            decode=(end - first) * 1e3,
            ttft=(first - self.arrived_at) * 1e3 if self.first_token_at is not None else 0.0,
        )


@dataclass(frozen=True, slots=True)
class Emitted:
    """Output token ``index`` of ``sequence`` came out at clock time ``at``; ``last``
    when it ends the sequence (read this, not ``sequence.done``, which is the state now)."""

    sequence: Sequence
    index: int
    at: float
    last: bool


class MigrationMode(StrEnum):
    RECOMPUTE = "recompute"  # prefill the shipped prompt here (costs this worker's queue)
    COPY = "copy"  # copy the KV from a peer of the region


@dataclass(slots=True)
class _Migration:
    namespace: Namespace
    tokens: NDArray[np.uint32]
    expected_ms: float


@dataclass(slots=True)
class _Prefill:
    job: Sequence | _Migration
    ends_at: float


@dataclass(slots=True)
class _Copy:
    namespace: Namespace
    tokens: NDArray[np.uint32]
    ends_at: float


@dataclass(slots=True)
class _Decode:
    batch: list[Sequence] = field(default_factory=list)  # in the running step
    joining: list[Sequence] = field(default_factory=list)  # from the next step on
    step_ends_at: float | None = None
    # While no sequence joins: the batch's plain steps (those before the step that ends
    # its first sequence) and that step's end (None: not counted yet; see
    # EmulatedEngine._plain_run). Skipping steps keeps the end: the same sums, in order.
    plain_steps: int = 0
    plain_until: float | None = None


class EmulatedEngine:
    """One worker's emulated engine over its :class:`PrefixCache`; see the module doc.

    ``stream`` False: :meth:`advance` returns only each sequence's first and last token
    (for a driver that reads no others, such as the simulator); the timeline is the same.
    """

    def __init__(
        self, cache: PrefixCache, cost: CostModel, clock: Clock, *, stream: bool = True
    ) -> None:
        self.cache = cache
        self.cost = cost
        self.stream = stream
        self._clock = clock
        self._queue: deque[Sequence | _Migration] = deque()
        self._queued_ms = 0.0  # sum of the queued jobs' expected_ms
        self._prefill: _Prefill | None = None
        self._decode = _Decode()
        self._copies: list[_Copy] = []
        self._emitted: list[Emitted] = []
        self._numbers = itertools.count()

    # -- inputs ----------------------------------------------------------------------

    def submit(self, request: Request) -> Sequence:
        """Queue a completion arriving now; its tokens come out of :meth:`advance`."""
        now = self._catch_up()
        match = self.cache.match(request.namespace, request.tokens)
        expected = self._service_ms(len(request.tokens), match)
        sequence = Sequence(next(self._numbers), request, now, expected)
        self._enqueue(sequence, now)
        return sequence

    def migrate(
        self, namespace: Namespace, tokens: NDArray[np.uint32], mode: MigrationMode
    ) -> None:
        """Bring ``tokens``' KV into this worker's DRAM by recompute or peer copy."""
        now = self._catch_up()
        if mode is MigrationMode.COPY:
            ends = now + self.cost.copy_ms(len(tokens)) / 1e3
            self._copies.append(_Copy(namespace, tokens, ends))
            return
        match = self.cache.match(namespace, tokens)
        expected = self.cost.prefill_ms(len(tokens), match.tokens)
        self._enqueue(_Migration(namespace, tokens, expected), now)

    def reset(self) -> list[Sequence]:
        """Drop every queued and running job and empty the cache; returns the completions
        that were dropped (marked ``aborted``)."""
        dropped = [j for j in self._queue if isinstance(j, Sequence)]
        if self._prefill is not None and isinstance(self._prefill.job, Sequence):
            dropped.append(self._prefill.job)
        dropped += self._decode.batch + self._decode.joining
        for sequence in dropped:
            sequence.aborted = True
        self._queue.clear()
        self._queued_ms = 0.0
        self._prefill = None
        self._decode = _Decode()
        self._copies.clear()
        self.cache.clear()
        return dropped

    # -- time ------------------------------------------------------------------------

    def next_event_at(self) -> float | None:
        """Clock time of the next state change; None when idle."""
        due = self._next_job_event()
        step = self._decode.step_ends_at
        if step is not None and (due is None or step < due):
            return step
        return due

    def next_notable_at(self) -> float | None:
        """Clock time of the next change other than a decode token that ends nothing: a
        prefill or copy ending (the cache changes, a first token comes out) or the step
        that ends a sequence; None when idle. Until then the decode batch is fixed, so
        the steps before it are plain; a driver that needs only first and last tokens
        calls :meth:`advance` then, which applies them all, each at its own time."""
        due = self._next_job_event()
        decode = self._decode
        t = decode.step_ends_at
        if t is None or (due is not None and due <= t):
            return due
        if not decode.joining:  # else the batch changes when this step ends
            t = self._plain_run(decode)
            if due is not None and due <= t:  # the steps' ends only grow
                return due
        return t

    def _plain_run(self, decode: _Decode) -> float:
        """Count the batch's plain steps and sum their ends (once per batch); returns the
        end of the step after them, the one that ends a sequence. The batch must be
        running with no sequence joining."""
        until = decode.plain_until
        if until is None:
            assert decode.step_ends_at is not None
            batch = decode.batch
            decode.plain_steps = min(s.request.max_tokens - s.generated for s in batch) - 1
            step_s = self.cost.decode_step_ms(len(batch)) / 1e3
            # One addition per step, left to right, as _start_step sums: the same floats.
            steps = itertools.repeat(step_s, decode.plain_steps)
            until = decode.plain_until = functools.reduce(operator.add, steps, decode.step_ends_at)
        return until

    def _next_job_event(self) -> float | None:
        """The earliest end of a copy or of the prefill; None when there is none."""
        due = None if self._prefill is None else self._prefill.ends_at
        for copy in self._copies:
            if due is None or copy.ends_at < due:
                due = copy.ends_at
        return due

    def advance(self) -> list[Emitted]:
        """Apply every change due by now; returns the tokens emitted since the last call."""
        self._catch_up()
        emitted, self._emitted = self._emitted, []
        return emitted

    def queue_ms(self) -> float:
        """Expected wait before a request arriving now starts its prefill."""
        prefill = self._prefill
        if prefill is None:
            return 0.0 + self._queued_ms  # (not -0.0)
        left_s = prefill.ends_at - self._clock.monotonic()
        return (0.0 if left_s < 0.0 else left_s * 1e3) + self._queued_ms

    @property
    def running(self) -> int:
        """Completions queued, in prefill or decoding."""
        prefilling = self._prefill is not None and isinstance(self._prefill.job, Sequence)
        queued = sum(isinstance(j, Sequence) for j in self._queue)
        return queued + prefilling + len(self._decode.batch) + len(self._decode.joining)

    # -- internals -------------------------------------------------------------------

    def _service_ms(self, prompt_tokens: int, match: CacheMatch) -> float:
        return self.cost.reload_ms(match.dram_tokens) + self.cost.prefill_ms(
            prompt_tokens, match.tokens
        )

    def _enqueue(self, job: Sequence | _Migration, now: float) -> None:
        self._queue.append(job)
        self._queued_ms += job.expected_ms
        if self._prefill is None:
            self._start_prefill(now)

    def _catch_up(self) -> float:
        """Process due events in time order; returns now."""
        now = self._clock.monotonic()
        while (due := self.next_event_at()) is not None and due <= now:
            # A prefill ending with a step joins the step that starts then.
            if self._prefill is not None and self._prefill.ends_at == due:
                self._end_prefill(due)
            elif self._decode.step_ends_at == due:
                if self.stream or not self._skip_plain_steps(now):
                    self._end_step(due)
            else:
                self._end_copies(due)
        return now

    def _skip_plain_steps(self, now: float) -> int:
        """Without streaming, end at once the due decode steps that emit nothing here:
        none ends a sequence and no job ends first, so the batch and the step time stay
        as they are. Each step's end is summed as :meth:`_start_step` sums it."""
        decode = self._decode
        if decode.joining or decode.step_ends_at is None:
            return 0
        until = self._plain_run(decode)
        job = self._next_job_event()
        if until <= now and (job is None or until < job):
            # Every plain step is due (the usual wake: at the step that ends a sequence).
            skipped, t = decode.plain_steps, until
        else:
            batch = decode.batch
            step_s = self.cost.decode_step_ms(len(batch)) / 1e3
            t = decode.step_ends_at
            skipped = 0
            while skipped < decode.plain_steps and t <= now and (job is None or t < job):
                skipped += 1
                t += step_s
        if skipped:
            for sequence in decode.batch:
                sequence.generated += skipped
            decode.plain_steps -= skipped
            decode.step_ends_at = t
        return skipped

    def _start_prefill(self, t: float) -> None:
        if not self._queue:
            return
        job = self._queue.popleft()
        self._queued_ms = max(self._queued_ms - job.expected_ms, 0.0) if self._queue else 0.0
        if isinstance(job, _Migration):
            held = self.cache.load(job.namespace, job.tokens)
            duration_ms = self.cost.prefill_ms(len(job.tokens), held.tokens)
        else:
            request = job.request
            job.reused = self.cache.use(request.namespace, request.tokens)
            job.started_at = t
            job.reload_ms = self.cost.reload_ms(job.reused.dram_tokens)
            job.prefill_ms = self.cost.prefill_ms(len(request.tokens), job.reused.tokens)
            duration_ms = job.reload_ms + job.prefill_ms
        self._prefill = _Prefill(job, t + duration_ms / 1e3)

    def _end_prefill(self, t: float) -> None:
        assert self._prefill is not None
        job = self._prefill.job
        self._prefill = None
        if isinstance(job, Sequence):
            job.first_token_at = t
            self._emit(job, t)
            if not job.done:
                self._decode.joining.append(job)
                if self._decode.step_ends_at is None:
                    self._start_step(t)
        self._start_prefill(t)

    def _start_step(self, t: float) -> None:
        decode = self._decode
        decode.batch = [s for s in decode.batch if not s.done] + decode.joining
        decode.joining = []
        decode.plain_until = None
        if decode.batch:
            decode.step_ends_at = t + self.cost.decode_step_ms(len(decode.batch)) / 1e3
        else:
            decode.step_ends_at = None

    def _end_step(self, t: float) -> None:
        for sequence in self._decode.batch:
            self._emit(sequence, t)
        self._start_step(t)

    def _end_copies(self, t: float) -> None:
        for copy in [c for c in self._copies if c.ends_at <= t]:
            self._copies.remove(copy)
            self.cache.load(copy.namespace, copy.tokens)

    def _emit(self, sequence: Sequence, t: float) -> None:
        sequence.generated += 1
        last = sequence.generated >= sequence.request.max_tokens
        if last or self.stream or sequence.generated == 1:
            self._emitted.append(Emitted(sequence, sequence.generated - 1, t, last))
        if last:
            sequence.finished_at = t
