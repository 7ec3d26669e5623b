# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
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

Compiled (Cython): the simulator drives every worker's engine several times per request
and reads every worker's queue for every queue vector. The durations are the cost
model's, summed in the order the Python engine summed them (the same floats). The
request, timings and emitted-token values are plain Python
(:mod:`kvcompass.worker.completion`); the signatures are in ``engine.pyi``.
"""

from collections import deque

from kvcompass.frozen_init import field_builder
from kvcompass.worker.cache import CacheMatch
from kvcompass.worker.completion import MigrationMode, Request, Timings

from cpython.pyport cimport PY_SSIZE_T_MAX

from kvcompass.worker.cost cimport CostModel

__all__ = [
    "Emitted",
    "EmulatedEngine",
    "MigrationMode",
    "Request",
    "Sequence",
    "Timings",
    "queue_vector",
]

#: Until its prefill starts, a sequence reuses nothing: one shared (frozen) match, not
#: one built per submit.
cdef object _NOTHING_REUSED = CacheMatch()
cdef object _COPY = MigrationMode.COPY
cdef object _ZERO_MS = 0.0
#: Timings built valid here: made without the type call and __init__.
cdef object _new_timings = field_builder(Timings)


cdef class Sequence:
    """The engine's record of one request, filled in as it runs (times in clock seconds;
    None for what has not happened). Hashed by identity."""

    cdef public Py_ssize_t number
    cdef public object request
    cdef public double arrived_at
    cdef public double expected_ms  # its prefill + reload as estimated at arrival
    cdef public object reused
    cdef public object started_at
    cdef public double reload_ms
    cdef public double prefill_ms
    cdef public object first_token_at
    cdef public object finished_at
    cdef public Py_ssize_t generated
    cdef public bint aborted
    cdef Py_ssize_t _max_tokens

    def __init__(self, Py_ssize_t number, request, double arrived_at, double expected_ms):
        self.number = number
        self.request = request
        self.arrived_at = arrived_at
        self.expected_ms = expected_ms
        self.reused = _NOTHING_REUSED
        self.started_at = None
        self.reload_ms = 0.0
        self.prefill_ms = 0.0
        self.first_token_at = None
        self.finished_at = None
        self.generated = 0
        self.aborted = False
        self._max_tokens = request.max_tokens

    @property
    def done(self):
        return self.finished_at is not None or self.aborted

    def timings(self):
        """The durations so far (0 for what has not happened)."""
        started = self.started_at if self.started_at is not None else self.arrived_at
        first = self.first_token_at if self.first_token_at is not None else started
        end = self.finished_at if self.finished_at is not None else first
        return _new_timings(  # queue, reload, prefill, decode, ttft
            (started - self.arrived_at) * 1e3,
            self.reload_ms,
            self.prefill_ms,
            (end - first) * 1e3,
            (first - self.arrived_at) * 1e3 if self.first_token_at is not None else 0.0,
        )

    def __repr__(self):
        return f"Sequence(number={self.number}, request={self.request.request_id!r})"


cdef class Emitted:
    """Output token ``index`` of ``sequence`` came out at clock time ``at``; ``last``
    when it ends the sequence (read this, not ``sequence.done``, which is the state now).
    Immutable, equal by value."""

    cdef readonly Sequence sequence
    cdef readonly Py_ssize_t index
    cdef readonly double at
    cdef readonly bint last

    def __init__(self, Sequence sequence, Py_ssize_t index, double at, bint last):
        self.sequence = sequence
        self.index = index
        self.at = at
        self.last = last

    def __eq__(self, other):
        if not isinstance(other, Emitted):
            return NotImplemented
        cdef Emitted o = <Emitted>other
        return (
            self.sequence is o.sequence
            and self.index == o.index
            and self.at == o.at
            and self.last == o.last
        )

    def __hash__(self):
        return hash((id(self.sequence), self.index, self.at, self.last))

    def __repr__(self):
        return (
            f"Emitted(sequence={self.sequence!r}, index={self.index}, at={self.at!r}, "
            f"last={self.last})"
        )


cdef class _Migration:
    """A recompute migration waiting in the prefill queue."""

    cdef object namespace
    cdef object tokens
    cdef double expected_ms

    def __init__(self, namespace, tokens, double expected_ms):
        self.namespace = namespace
        self.tokens = tokens
        self.expected_ms = expected_ms


cdef class _Copy:
    """A copy from a peer, landing in DRAM at ``ends_at``."""

    cdef object namespace
    cdef object tokens
    cdef double ends_at

    def __init__(self, namespace, tokens, double ends_at):
        self.namespace = namespace
        self.tokens = tokens
        self.ends_at = ends_at


cdef class EmulatedEngine:
    """One worker's emulated engine over its :class:`PrefixCache`; see the module doc.

    ``stream`` False: :meth:`advance` returns only each sequence's first and last token
    (for a driver that reads no others, such as the simulator); the timeline is the same.
    """

    cdef readonly object cache
    cdef readonly CostModel cost
    cdef public bint stream
    cdef object _clock
    cdef object _queue  # deque of Sequence | _Migration, in arrival order
    cdef double _queued_ms  # sum of the queued jobs' expected_ms
    # The prefill running (None: none) and its end.
    cdef object _prefill_job
    cdef double _prefill_ends
    # Decode: the batch in the running step, those joining from the next step on, the
    # running step's end (valid while _stepping).
    cdef list _batch
    cdef list _joining
    cdef bint _stepping
    cdef double _step_ends
    # While no sequence joins: the batch's plain steps (those before the step that ends
    # its first sequence) and that step's end (valid while _counted; see _plain_run).
    # Skipping steps keeps the end: the same sums, in order.
    cdef Py_ssize_t _plain_steps
    cdef bint _counted
    cdef double _plain_until
    cdef list _copies
    cdef list _emitted
    cdef Py_ssize_t _numbers

    def __init__(self, cache, CostModel cost, clock, *, bint stream=True):
        self.cache = cache
        self.cost = cost
        self.stream = stream
        self._clock = clock
        self._queue = deque()
        self._copies = []
        self._emitted = []
        self._numbers = 0
        self._drop_jobs()

    # -- inputs ----------------------------------------------------------------------

    def submit(self, request):
        """Queue a completion arriving now; its tokens come out of :meth:`advance`."""
        cdef double now = self._catch_up()
        match = self.cache.match(request.namespace, request.tokens)
        cdef double expected = self.cost.reload_ms(match.dram_tokens) + self.cost.prefill_ms(
            len(request.tokens), match.tokens
        )
        sequence = Sequence(self._numbers, request, now, expected)
        self._numbers += 1
        self._enqueue(sequence, expected, now)
        return sequence

    def migrate(self, namespace, tokens, mode):
        """Bring ``tokens``' KV into this worker's DRAM by recompute or peer copy."""
        cdef double now = self._catch_up()
        if mode is _COPY:
            ends = now + self.cost.copy_ms(len(tokens)) / 1e3
            self._copies.append(_Copy(namespace, tokens, ends))
            return
        match = self.cache.match(namespace, tokens)
        cdef double expected = self.cost.prefill_ms(len(tokens), match.tokens)
        self._enqueue(_Migration(namespace, tokens, expected), expected, now)

    def reset(self):
        """Drop every queued and running job and empty the cache; returns the completions
        that were dropped (marked ``aborted``)."""
        dropped = [j for j in self._queue if isinstance(j, Sequence)]
        if isinstance(self._prefill_job, Sequence):
            dropped.append(self._prefill_job)
        dropped += self._batch + self._joining
        for sequence in dropped:
            (<Sequence>sequence).aborted = True
        self._drop_jobs()
        self.cache.clear()
        return dropped

    cdef void _drop_jobs(self):
        """No job queued, prefilling, decoding or being copied."""
        self._queue.clear()
        self._queued_ms = 0.0
        self._prefill_job = None
        self._prefill_ends = 0.0
        self._batch = []
        self._joining = []
        self._stepping = False
        self._step_ends = 0.0
        self._plain_steps = 0
        self._counted = False
        self._plain_until = 0.0
        self._copies.clear()

    # -- time ------------------------------------------------------------------------

    def next_event_at(self):
        """Clock time of the next state change; None when idle."""
        cdef double due
        if self._next_event(&due):
            return due
        return None

    def next_notable_at(self):
        """Clock time of the next change other than a decode token that ends nothing: a
        prefill or copy ending (the cache changes, a first token comes out) or the step
        that ends a sequence; None when idle. Until then the steps are plain (sequences
        that join the batch at a step's end change no output); a driver that needs only
        first and last tokens calls :meth:`advance` then, which applies them all, each at
        its own time."""
        cdef double due, t
        cdef bint job = self._next_job_event(&due)
        if not self._stepping:
            return due if job else None
        t = self._step_ends
        if job and due <= t:
            return due
        t = self._joined_plain_run() if self._joining else self._plain_run()
        if job and due <= t:  # the steps' ends only grow
            return due
        return t

    cdef double _joined_plain_run(self):
        """:meth:`_plain_run` of the batch the joining sequences make at this step's end,
        without changing anything: the end of the first step that ends a sequence, summed
        as :meth:`_end_step`, :meth:`_start_step` and :meth:`_plain_run` will sum it (the
        same float). A simulator skips one wake-up a request this way (the join alone)."""
        cdef Py_ssize_t in_batch = _fewest_left(self._batch)
        if in_batch == 1:
            return self._step_ends  # a last token at this step's end: it ends a sequence
        # The batch emits a token each at this step's end, then the joined batch steps.
        cdef Py_ssize_t least = min(in_batch - 1, _fewest_left(self._joining))
        cdef double step_s = (
            self.cost.decode_step_ms(len(self._batch) + len(self._joining)) / 1e3
        )
        return _after_steps(self._step_ends, step_s, least)

    def advance(self):
        """Apply every change due by now; returns the tokens emitted since the last call."""
        self._catch_up()
        emitted = self._emitted
        self._emitted = []
        return emitted

    def queue_ms(self):
        """Expected wait before a request arriving now starts its prefill."""
        return self._queue_ms()

    cdef double _queue_ms(self) except? -1.0:
        if self._prefill_job is None:
            return 0.0 + self._queued_ms  # (not -0.0)
        cdef double left_s = self._prefill_ends - self._clock.monotonic()
        return (0.0 if left_s < 0.0 else left_s * 1e3) + self._queued_ms

    @property
    def running(self):
        """Completions queued, in prefill or decoding."""
        cdef Py_ssize_t queued = 0
        for job in self._queue:
            if isinstance(job, Sequence):
                queued += 1
        return (
            queued
            + isinstance(self._prefill_job, Sequence)
            + len(self._batch)
            + len(self._joining)
        )

    # -- internals -------------------------------------------------------------------

    cdef bint _next_job_event(self, double* due):
        """The earliest end of a copy or of the prefill, into ``due``; False when none."""
        cdef bint found = self._prefill_job is not None
        if found:
            due[0] = self._prefill_ends
        cdef _Copy copy
        for copy in self._copies:
            if not found or copy.ends_at < due[0]:
                due[0] = copy.ends_at
                found = True
        return found

    cdef bint _next_event(self, double* due):
        cdef bint found = self._next_job_event(due)
        if self._stepping and (not found or self._step_ends < due[0]):
            due[0] = self._step_ends
            return True
        return found

    cdef double _plain_run(self):
        """Count the batch's plain steps and sum their ends (once per batch); returns the
        end of the step after them, the one that ends a sequence. The batch must be
        running with no sequence joining."""
        cdef double step_s
        if not self._counted:
            self._plain_steps = _fewest_left(self._batch) - 1 if self._batch else -1
            step_s = self.cost.decode_step_ms(len(self._batch)) / 1e3
            self._plain_until = _after_steps(self._step_ends, step_s, self._plain_steps)
            self._counted = True
        return self._plain_until

    cdef double _catch_up(self) except? -1.0:
        """Process due events in time order; returns now."""
        cdef double now = self._clock.monotonic()
        cdef double due
        while self._next_event(&due) and due <= now:
            # A prefill ending with a step joins the step that starts then.
            if self._prefill_job is not None and self._prefill_ends == due:
                self._end_prefill(due)
            elif self._stepping and self._step_ends == due:
                if self.stream or not self._skip_plain_steps(now):
                    self._end_step(due)
            else:
                self._end_copies(due)
        return now

    cdef Py_ssize_t _skip_plain_steps(self, double now) except -1:
        """Without streaming, end at once the due decode steps that emit nothing here:
        none ends a sequence and no job ends first, so the batch and the step time stay
        as they are. Each step's end is summed as :meth:`_start_step` sums it."""
        if self._joining or not self._stepping:
            return 0
        cdef double until = self._plain_run()
        cdef double job
        cdef bint has_job = self._next_job_event(&job)
        cdef Py_ssize_t skipped
        cdef double t, step_s
        if until <= now and (not has_job or until < job):
            # Every plain step is due (the usual wake: at the step that ends a sequence).
            skipped, t = self._plain_steps, until
        else:
            step_s = self.cost.decode_step_ms(len(self._batch)) / 1e3
            t = self._step_ends
            skipped = 0
            while skipped < self._plain_steps and t <= now and (not has_job or t < job):
                skipped += 1
                t += step_s
        cdef Sequence s
        if skipped:
            for s in self._batch:
                s.generated += skipped
            self._plain_steps -= skipped
            self._step_ends = t
        return skipped

    cdef int _enqueue(self, job, double expected_ms, double now) except -1:
        self._queue.append(job)
        self._queued_ms += expected_ms
        if self._prefill_job is None:
            self._start_prefill(now)
        return 0

    cdef int _start_prefill(self, double t) except -1:
        if not self._queue:
            return 0
        job = self._queue.popleft()
        cdef double expected = (
            (<Sequence>job).expected_ms if isinstance(job, Sequence)
            else (<_Migration>job).expected_ms
        )
        cdef double left
        if self._queue:
            left = self._queued_ms - expected
            self._queued_ms = 0.0 if 0.0 > left else left  # max(left, 0.0), as before
        else:
            self._queued_ms = 0.0
        cdef double duration_ms
        cdef Sequence sequence
        cdef _Migration migration
        if isinstance(job, _Migration):
            migration = <_Migration>job
            held = self.cache.load(migration.namespace, migration.tokens)
            duration_ms = self.cost.prefill_ms(len(migration.tokens), held.tokens)
        else:
            sequence = <Sequence>job
            request = sequence.request
            sequence.reused = self.cache.use(request.namespace, request.tokens)
            sequence.started_at = t
            sequence.reload_ms = self.cost.reload_ms(sequence.reused.dram_tokens)
            sequence.prefill_ms = self.cost.prefill_ms(
                len(request.tokens), sequence.reused.tokens
            )
            duration_ms = sequence.reload_ms + sequence.prefill_ms
        self._prefill_job = job
        self._prefill_ends = t + duration_ms / 1e3
        return 0

    cdef int _end_prefill(self, double t) except -1:
        job = self._prefill_job
        self._prefill_job = None
        cdef Sequence sequence
        if isinstance(job, Sequence):
            sequence = <Sequence>job
            sequence.first_token_at = t
            self._emit(sequence, t)
            if not (sequence.finished_at is not None or sequence.aborted):
                self._joining.append(sequence)
                if not self._stepping:
                    self._start_step(t)
        self._start_prefill(t)
        return 0

    cdef int _start_step(self, double t) except -1:
        cdef Sequence s
        cdef list batch = []
        for s in self._batch:
            if not (s.finished_at is not None or s.aborted):
                batch.append(s)
        batch += self._joining
        self._batch = batch
        self._joining = []
        self._counted = False
        if batch:
            self._stepping = True
            self._step_ends = t + self.cost.decode_step_ms(len(batch)) / 1e3
        else:
            self._stepping = False
        return 0

    cdef int _end_step(self, double t) except -1:
        cdef Sequence s
        for s in self._batch:
            self._emit(s, t)
        self._start_step(t)
        return 0

    cdef int _end_copies(self, double t) except -1:
        cdef _Copy copy
        landed = [c for c in self._copies if (<_Copy>c).ends_at <= t]
        for copy in landed:
            self._copies.remove(copy)
            self.cache.load(copy.namespace, copy.tokens)
        return 0

    cdef int _emit(self, Sequence sequence, double t) except -1:
        sequence.generated += 1
        cdef bint last = sequence.generated >= sequence._max_tokens
        if last or self.stream or sequence.generated == 1:
            self._emitted.append(Emitted(sequence, sequence.generated - 1, t, last))
        if last:
            sequence.finished_at = t
        return 0


cdef Py_ssize_t _fewest_left(list sequences):
    """The fewest tokens any of ``sequences`` has left to emit (PY_SSIZE_T_MAX: none)."""
    cdef Sequence s
    cdef Py_ssize_t least = PY_SSIZE_T_MAX, left
    for s in sequences:
        left = s._max_tokens - s.generated
        if left < least:
            least = left
    return least


cdef inline double _after_steps(double t, double step_s, Py_ssize_t steps) noexcept:
    """``t`` plus ``steps`` steps, one addition each, left to right, as the engine ends
    them one by one (the same float)."""
    cdef Py_ssize_t _
    for _ in range(steps):
        t += step_s
    return t


def queue_vector(tuple indices, tuple engines):
    """``{indices[i]: engines[i].queue_ms()}`` in one call: a region's queue vector, as
    its host sends one with every response and broadcast (several per request)."""
    if len(indices) != len(engines):
        raise ValueError(f"{len(indices)} indices for {len(engines)} engines")
    cdef dict out = {}
    cdef Py_ssize_t i
    cdef double ms
    for i in range(len(engines)):
        ms = (<EmulatedEngine?>engines[i])._queue_ms()
        # An idle worker's 0.0 is one shared float (most are idle): no float to make.
        out[indices[i]] = _ZERO_MS if ms == 0.0 else ms
    return out
