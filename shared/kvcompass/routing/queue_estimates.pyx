# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""Queue estimates T̂q(r) (paper §3.4): what an edge believes every worker's queue to be.

The rules are :mod:`kvcompass.routing.queues`' (where this class is re-exported, beside
the sender's half): an own-region vector replaces (live), another region's is folded in
with an EWMA of weight w when a response piggybacks it and replaces when broadcast; the
work this edge forwarded is added until a report sent after it reached the worker.

Compiled (Cython): every region's vector reaches every edge every local period, so on
the simulator's Mixed workload an edge folds about eight vectors per request. The state
is C arrays; ``values`` and ``blocked`` stay Python lists, updated in place, because
every policy reads them. The signatures are in ``queue_estimates.pyi``.
"""

cimport cython

from array import array
from collections import deque

from libc.math cimport INFINITY
from libc.stdint cimport int64_t
from libc.string cimport memcmp

__all__ = ["QueueEstimates"]

# Where a worker's estimate last came from, as codes; the names are Source's.
cdef enum:
    _NONE = 0
    _LIVE = 1
    _PIGGYBACK = 2
    _BROADCAST = 3
    _DOWN = 4

cdef tuple _SOURCE_NAMES = ("none", "live", "piggyback", "broadcast", "down")


cdef class QueueEstimates:
    """Per worker (global index): estimate in ms, its source and its age.

    ``values`` is the live list the scorer reads: the last report (folded) plus pending.
    ``blocked`` is 0 per worker, or +inf while it is down: what a load-blind score adds,
    so that a failed worker is avoided even when queues are ignored.
    """

    cdef readonly str origin_region
    cdef readonly double weight
    cdef readonly Py_ssize_t n_workers
    cdef readonly list values
    cdef readonly list blocked
    # ``values`` as C doubles: a vector mostly repeats what an estimate already holds
    # (idle workers, on every local period), and storing an equal value again made and
    # freed a float object each time.
    cdef double[::1] _value
    cdef object _clock
    # Per worker: the last report as folded (ms), the forwarded work on top of it (ms)
    # and, oldest first, (wall ns the work reaches the worker, ms) of each forward.
    cdef double[::1] _reported
    cdef double[::1] _pending
    cdef list _in_flight
    cdef int64_t[::1] _one_way_ns
    cdef unsigned char[::1] _source
    cdef double[::1] _reported_at
    cdef int64_t[::1] _sent_ns  # sender wall clock of the last applied report
    # Since when the estimate has been exactly 0 (valid where _zero is set).
    cdef double[::1] _zero_since
    cdef unsigned char[::1] _zero

    def __init__(self, topology, str origin_region, clock, double piggyback_weight):
        if not 0 < piggyback_weight <= 1:
            raise ValueError(f"piggyback weight must be in (0, 1], got {piggyback_weight}")
        topology.region_index(origin_region)  # KeyError for an unknown region
        cdef Py_ssize_t n = len(topology.workers)
        cdef double now = clock.monotonic()
        self.origin_region = origin_region
        self.weight = piggyback_weight
        self.n_workers = n
        self._clock = clock
        self.values = [0.0] * n
        self.blocked = [0.0] * n
        self._value = _doubles(n, 0.0)
        self._reported = _doubles(n, 0.0)
        self._pending = _doubles(n, 0.0)
        self._in_flight = [deque() for _ in range(n)]
        self._one_way_ns = _int64s(
            [round(topology.wan_ms(origin_region, w.region) * 1e6) for w in topology.workers]
        )
        self._source = bytearray(n)
        self._reported_at = _doubles(n, now)
        self._sent_ns = _int64s([-1] * n)
        self._zero_since = _doubles(n, now)
        self._zero = bytearray(b"\x01" * n)

    @cython.boundscheck(False)  # every index below is checked against n first
    def apply(self, queues, bint piggybacked):
        """Fold a region's vector in; returns how many workers it updated.

        Own region: live, replaces. Another region's: EWMA of weight w if it came on a
        response, replaces if broadcast. A worker's entry is skipped if this edge already
        applied a report sent at the same time or later (vectors overtake each other: a
        piggyback crosses the WAN, the broadcast the bus), or if its index is unknown.
        """
        cdef unsigned char kind
        if queues.region == self.origin_region:
            kind = _LIVE
        else:
            kind = _PIGGYBACK if piggybacked else _BROADCAST
        cdef double now = self._clock.monotonic()
        cdef int64_t sent = queues.sent_at_ns
        cdef double w = self.weight
        cdef Py_ssize_t n = self.n_workers, worker, applied = 0
        cdef double ms, before
        cdef unsigned char source
        for key, value in queues.queue_ms.items():
            try:
                worker = key
            except OverflowError:
                continue  # far out of range
            if worker < 0 or worker >= n or sent <= self._sent_ns[worker]:
                continue
            ms = float(value)
            if not ms > 0.0:  # clamps negatives and NaN to 0
                ms = 0.0
            source = self._source[worker]
            if kind == _PIGGYBACK and source != _NONE and source != _DOWN:
                before = self._reported[worker]
                ms = before + w * (ms - before)
            self._reported[worker] = ms
            # Work is in flight exactly when pending is above 0 (add_pending counts only
            # positive work, and supersede sums what is left): the deque stays untouched.
            if self._pending[worker] > 0.0:
                self._supersede_pending(worker, sent)
                ms += self._pending[worker]
            if source == _DOWN:  # the only source whose blocked entry is not 0
                self.blocked[worker] = 0.0
            self._source[worker] = kind
            self._reported_at[worker] = now
            self._sent_ns[worker] = sent
            self._set(worker, ms, now)
            applied += 1
        return applied

    cdef void _supersede_pending(self, Py_ssize_t worker, int64_t sent_at_ns):
        """Drop the forwarded work a report sent at ``sent_at_ns`` already counts."""
        flight = self._in_flight[worker]
        while flight and flight[0][0] <= sent_at_ns:
            flight.popleft()
        # Python's sum, as before: its float addition is part of the result.
        self._pending[worker] = sum([ms for _, ms in flight]) if flight else 0.0

    def add_pending(self, Py_ssize_t worker, double ms):
        """Work this edge just forwarded to ``worker``, counted until its next report
        (none for ``ms`` not above 0, NaN included: pending is above 0 exactly while
        work is in flight)."""
        if not ms > 0 or self._source[worker] == _DOWN:
            return
        self._in_flight[worker].append(
            (self._clock.wall_ns() + self._one_way_ns[worker], ms)
        )
        self._pending[worker] += ms
        self._set(worker, self._reported[worker] + self._pending[worker], self._clock.monotonic())

    def mark_down(self, Py_ssize_t worker):
        """The worker failed: infinitely busy until a report sent after now arrives."""
        self._source[worker] = _DOWN
        self._pending[worker] = 0.0
        self._in_flight[worker].clear()
        cdef int64_t wall = self._clock.wall_ns()
        if wall > self._sent_ns[worker]:
            self._sent_ns[worker] = wall
        self.blocked[worker] = INFINITY
        self._set(worker, INFINITY, self._clock.monotonic())

    cdef void _set(self, Py_ssize_t worker, double value, double now):
        if not _same_bits(value, self._value[worker]):
            self._value[worker] = value
            self.values[worker] = value
        if value > 0.0:
            self._zero[worker] = False
        elif not self._zero[worker]:
            self._zero[worker] = True
            self._zero_since[worker] = now

    def source(self, Py_ssize_t worker):
        """Where the estimate came from ("pending": forwarded work on top of a report)."""
        cdef unsigned char src = self._source[worker]
        return "pending" if self._pending[worker] > 0 and src != _DOWN else _SOURCE_NAMES[src]

    def age_s(self, Py_ssize_t worker):
        """Seconds since this edge applied the last report about ``worker``."""
        return self._clock.monotonic() - self._reported_at[worker]

    def idle_for_s(self, Py_ssize_t worker):
        """How long the estimate has been exactly 0 (-inf while it is not)."""
        if not self._zero[worker]:
            return -INFINITY
        return self._clock.monotonic() - self._zero_since[worker]


cdef inline bint _same_bits(double a, double b) noexcept:
    return memcmp(&a, &b, sizeof(double)) == 0


cdef double[::1] _doubles(Py_ssize_t n, double value):
    return array("d", [value]) * n


cdef int64_t[::1] _int64s(list values):
    return array("q", values)
