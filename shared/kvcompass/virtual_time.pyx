# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""Virtual time for driving the core's classes without waiting: a clock the driver sets,
and a time-ordered queue of events that runs them.

The simulator runs every request as ten-odd events (an arrival, its submission, engine
wake-ups, a response, queue vectors, index flushes and patches), so the queue and the
clock are compiled (Cython): an event's push is a C heap insertion, and
:meth:`EventQueue.run` pops, sets the clock and calls the handler without a Python
frame of its own. The signatures are in ``virtual_time.pyi``.
"""

cimport cython
from libc.math cimport isnan, nearbyint
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc, realloc

__all__ = ["EventQueue", "VirtualClock"]


@cython.final
cdef class VirtualClock:
    """A clock that moves only when told to: :meth:`set` to an event's exact time (as
    the event loop does), or :meth:`advance` by a duration (as ``ManualClock``).

    ``advance(t - now)`` would add float rounding at every step, and an engine whose next
    event is due at ``t`` must see ``monotonic() == t`` to process it. Wall time follows
    as ``round(t * 1e9)`` nanoseconds.
    """

    cdef double _monotonic
    cdef int64_t _wall_ns

    def __init__(self, double monotonic=0.0, int64_t wall_ns=0):
        self._monotonic = monotonic
        self._wall_ns = wall_ns

    def monotonic(self):
        return self._monotonic

    def wall_ns(self):
        return self._wall_ns

    cpdef set(self, double t):
        if t < self._monotonic or isnan(t):
            raise ValueError(f"a clock cannot go back from {self._monotonic} to {t}")
        self._monotonic = t
        self._wall_ns = <int64_t>nearbyint(t * 1e9)  # round half to even, as round()

    def advance(self, double seconds):
        """Move both clocks forward by ``seconds`` (≥ 0)."""
        if seconds < 0 or isnan(seconds):
            raise ValueError(f"a clock cannot go back {-seconds} s")
        self._monotonic += seconds
        self._wall_ns += <int64_t>nearbyint(seconds * 1e9)


cdef struct Due:
    double t
    int64_t order  # scheduling order: equal times run first scheduled, first run
    Py_ssize_t slot  # where its handler and argument wait


cdef inline bint _before(const Due* a, const Due* b) noexcept nogil:
    return a.t < b.t or (a.t == b.t and a.order < b.order)


@cython.final
cdef class EventQueue:
    """Events as (time, handler, argument); equal times run in scheduling order, which
    makes a run a function of its inputs and seed alone.

    The heap holds times in C; handlers and arguments wait in Python lists (so the
    garbage collector sees them), in slots that a popped event frees for the next.
    """

    cdef Due* _heap
    cdef Py_ssize_t _size
    cdef Py_ssize_t _allocated
    cdef int64_t _order
    cdef list _handlers
    cdef list _args
    cdef Py_ssize_t* _free  # slots no event holds, a stack
    cdef Py_ssize_t _n_free
    cdef bint _stopped

    def __cinit__(self):
        self._allocated = 256
        self._heap = <Due*>malloc(self._allocated * sizeof(Due))
        self._free = <Py_ssize_t*>malloc(self._allocated * sizeof(Py_ssize_t))
        if self._heap is NULL or self._free is NULL:
            raise MemoryError()
        self._handlers = []
        self._args = []

    def __dealloc__(self):
        free(self._heap)
        free(self._free)

    def __len__(self):
        return self._size

    def push(self, double t, handler, arg=None):
        """Run ``handler(arg)`` at time ``t``."""
        cdef Due due
        cdef Due* grown
        cdef Py_ssize_t* grown_free
        cdef Py_ssize_t at, up
        if isnan(t):
            raise ValueError("an event's time is NaN")
        if self._size == self._allocated:  # then every slot is taken: no free one moves
            grown = <Due*>realloc(self._heap, 2 * self._allocated * sizeof(Due))
            if grown is NULL:
                raise MemoryError()
            self._heap = grown
            grown_free = <Py_ssize_t*>realloc(self._free, 2 * self._allocated * sizeof(Py_ssize_t))
            if grown_free is NULL:
                raise MemoryError()
            self._free = grown_free
            self._allocated *= 2
        if self._n_free:
            self._n_free -= 1
            due.slot = self._free[self._n_free]
            self._handlers[due.slot] = handler
            self._args[due.slot] = arg
        else:
            due.slot = len(self._handlers)
            self._handlers.append(handler)
            self._args.append(arg)
        due.t = t
        due.order = self._order
        self._order += 1
        at = self._size
        self._size += 1
        while at > 0:
            up = (at - 1) >> 1
            if not _before(&due, &self._heap[up]):
                break
            self._heap[at] = self._heap[up]
            at = up
        self._heap[at] = due

    def pop(self):
        """The first event, as (time, handler, argument); IndexError when empty."""
        if not self._size:
            raise IndexError("pop from an empty event queue")
        cdef Due due = self._take()
        handler = self._handlers[due.slot]
        arg = self._args[due.slot]
        self._release(due.slot)
        return due.t, handler, arg

    def next_time(self):
        """The first event's time; None when empty."""
        return self._heap[0].t if self._size else None

    def stop(self):
        """End the current :meth:`run` after the event that calls this."""
        self._stopped = True

    def run(self, VirtualClock clock, until=None):
        """Run events in order, each at its time on ``clock``, until the queue is empty,
        an event calls :meth:`stop`, or (given ``until``) the next is due after it."""
        cdef Due due
        cdef double end = float("inf") if until is None else until
        self._stopped = False
        while self._size and not self._stopped and self._heap[0].t <= end:
            due = self._take()
            handler = self._handlers[due.slot]
            arg = self._args[due.slot]
            self._release(due.slot)
            clock.set(due.t)
            handler(arg)

    cdef Due _take(self) noexcept:
        """Take the first event off the heap (not empty)."""
        cdef Due first = self._heap[0]
        cdef Due moved
        cdef Py_ssize_t at = 0, child
        self._size -= 1
        if self._size:
            moved = self._heap[self._size]
            while True:
                child = 2 * at + 1
                if child >= self._size:
                    break
                if child + 1 < self._size and _before(&self._heap[child + 1], &self._heap[child]):
                    child += 1
                if not _before(&self._heap[child], &moved):
                    break
                self._heap[at] = self._heap[child]
                at = child
            self._heap[at] = moved
        return first

    cdef void _release(self, Py_ssize_t slot) noexcept:
        """Free a taken event's slot (its handler and argument read first)."""
        self._handlers[slot] = None
        self._args[slot] = None
        self._free[self._n_free] = slot
        self._n_free += 1
