# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False, cdivision=True
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""Prefixes an edge has just sent to a worker, credited before the index knows them.

A worker holds a prompt's blocks once its prefill starts, and the index learns of them a
flush and a patch later. Until then a second request with the same prefix sees no
holder, goes wherever the score says and recomputes it. On an idle pool that window is
milliseconds; in overload it is the whole queue wait, seconds in which every request of
a new prefix family lands on a different worker. So the edge remembers where it sent
each prefix (its keys at that region's lengths) until the worker has surely started it:
the queue estimate it routed on plus a slack for the index's lag and the estimate's
error. A request whose keys were sent there is credited that length, in VRAM, as if the
index said so (the index's own longer match wins). Peers do the same: llm-d's
speculative entries with a TTL, Dynamo's predicted active blocks.

The policy records only what it sends to its own region, where its queue estimates are
live: a remote worker's estimate is a report old, and a credit there draws more of a hot
family into a queue the edge cannot see grow (on sim-16region WildChat at 3 λ0 that
doubled the hottest worker's load and raised P99 TTFT by a third). Each edge remembers
only its own decisions; a claim the worker did not keep (the request went to a fallback,
or its blocks were evicted first) costs that worker belief, as any false claim.

Compiled (Cython): every decision credits and records a prompt's keys. The sends are a
C hash table of key → (worker, until) with linear probing and a FIFO of sends over a
ring of their keys; what it answers is what the Python it replaced answered
(``tests/unit/_pending_reference.py``, held to it by a property test). The signatures
are in ``pending.pyi``.
"""

cimport cython
from libc.math cimport isfinite
from libc.stdint cimport int32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

from kvcompass.index.layout import Tier

__all__ = ["PendingPrefixes"]

cdef object _VRAM = int(Tier.VRAM)


cdef struct Slot:
    uint64_t key
    double until
    int32_t worker
    bint used


cdef struct Send:
    double until
    Py_ssize_t first  # its first kept key, an index into the key ring (not wrapped)
    Py_ssize_t count  # its keys still counted


cdef inline uint64_t _spread(uint64_t key) noexcept nogil:
    """A key's probe start: keys are hash digests already, but their low bits are
    mixed in anyway (fmix64) so that a table sized by powers of two sees all of them."""
    key ^= key >> 33
    key *= 0xFF51AFD7ED558CCDULL
    key ^= key >> 33
    return key


@cython.final
cdef class PendingPrefixes:
    """Key → (worker, until) for this edge's recent sends to its own region; see the
    module docstring. At most ``capacity`` keys are remembered (the oldest go first).

    Both methods take the prompt's (length, key) pairs at the edge's own region's
    lengths: the keys a send records are the keys a later request is credited by.
    """

    cdef readonly double slack_s
    cdef readonly Py_ssize_t capacity
    cdef Slot* _slots
    cdef Py_ssize_t _n_slots  # a power of two
    cdef Py_ssize_t _n_keys  # distinct keys held
    cdef Send* _sends  # a ring
    cdef Py_ssize_t _sends_head
    cdef Py_ssize_t _n_sends
    cdef Py_ssize_t _sends_size
    cdef uint64_t* _ring  # every send's keys in order, indexed modulo _ring_size
    cdef Py_ssize_t _ring_size
    cdef Py_ssize_t _ring_end  # where the next send's keys go (not wrapped)
    cdef Py_ssize_t _recorded  # keys of the kept sends, repeats included

    def __cinit__(self):
        self._n_slots = 64
        self._slots = <Slot*>calloc(self._n_slots, sizeof(Slot))
        self._sends_size = 16
        self._sends = <Send*>malloc(self._sends_size * sizeof(Send))
        self._ring_size = 64
        self._ring = <uint64_t*>malloc(self._ring_size * sizeof(uint64_t))
        if self._slots is NULL or self._sends is NULL or self._ring is NULL:
            raise MemoryError()

    def __init__(self, double slack_s, Py_ssize_t capacity=65_536):
        if not slack_s >= 0 or capacity < 1:
            raise ValueError("slack_s must be >= 0 and capacity >= 1")
        self.slack_s = slack_s
        self.capacity = capacity

    def __dealloc__(self):
        free(self._slots)
        free(self._sends)
        free(self._ring)

    def __len__(self):
        return self._n_keys

    def record(self, Py_ssize_t worker, object pairs, double now, double wait_s):
        """``worker`` will hold the prefixes ``pairs`` once the ``wait_s`` ahead of them
        has passed (infinite: the worker is believed down and nothing is recorded)."""
        cdef double until
        cdef Py_ssize_t n, j
        cdef uint64_t key
        cdef Send* send
        if not isfinite(wait_s):
            return
        until = now + wait_s + self.slack_s
        n = len(pairs)
        self._reserve_ring(n)
        self._reserve_send()
        for j in range(n):
            key = pairs[j][1]
            self._ring[(self._ring_end + j) & (self._ring_size - 1)] = key
        for j in range(n):
            self._put(self._ring[(self._ring_end + j) & (self._ring_size - 1)], worker, until)
        send = &self._sends[(self._sends_head + self._n_sends) & (self._sends_size - 1)]
        send.until = until
        send.first = self._ring_end
        send.count = n
        self._n_sends += 1
        self._ring_end += n
        self._recorded += n
        self._prune(now)

    def credit(self, object pairs, object lengths, object tiers, double now):
        """The index's ``lengths`` and ``tiers`` with the pending prefixes among
        ``pairs`` added where they are longer (new lists then; the same ones otherwise)."""
        cdef Slot* slot
        cdef Py_ssize_t n, j
        cdef list credited
        if not self._n_keys:
            return lengths, tiers
        n = len(pairs)
        credited = None
        for j in range(n):
            length, key = pairs[j]
            slot = self._find(key)
            if slot is NULL:
                continue
            if slot.until >= now and length > lengths[slot.worker]:
                if credited is None:
                    credited = []
                credited.append((slot.worker, length))  # pairs ascend: longer ones later
        if credited is None:
            return lengths, tiers
        lengths, tiers = list(lengths), list(tiers)
        for worker, length in credited:
            lengths[worker] = length
            tiers[worker] = _VRAM
        return lengths, tiers

    # -- the hash table ------------------------------------------------------------

    cdef Slot* _find(self, uint64_t key) noexcept:
        cdef Py_ssize_t mask = self._n_slots - 1
        cdef Py_ssize_t at = <Py_ssize_t>(_spread(key) & <uint64_t>mask)
        while self._slots[at].used:
            if self._slots[at].key == key:
                return &self._slots[at]
            at = (at + 1) & mask
        return NULL

    cdef int _put(self, uint64_t key, Py_ssize_t worker, double until) except -1:
        cdef Py_ssize_t mask, at
        if 2 * (self._n_keys + 1) > self._n_slots:
            self._grow()
        mask = self._n_slots - 1
        at = <Py_ssize_t>(_spread(key) & <uint64_t>mask)
        while self._slots[at].used and self._slots[at].key != key:
            at = (at + 1) & mask
        if not self._slots[at].used:
            self._slots[at].used = True
            self._slots[at].key = key
            self._n_keys += 1
        self._slots[at].worker = <int32_t>worker
        self._slots[at].until = until
        return 0

    cdef void _remove(self, Slot* slot) noexcept:
        """Empty ``slot`` and shift the run after it back (linear probing's deletion:
        every key stays reachable from its probe start without tombstones)."""
        cdef Py_ssize_t mask = self._n_slots - 1
        cdef Py_ssize_t hole = slot - self._slots
        cdef Py_ssize_t at = hole, home
        self._n_keys -= 1
        while True:
            at = (at + 1) & mask
            if not self._slots[at].used:
                break
            home = <Py_ssize_t>(_spread(self._slots[at].key) & <uint64_t>mask)
            # Move it into the hole unless its home lies cyclically in (hole, at].
            if (at > hole and (home <= hole or home > at)) or (
                at < hole and home <= hole and home > at
            ):
                self._slots[hole] = self._slots[at]
                hole = at
        self._slots[hole].used = False

    cdef int _grow(self) except -1:
        cdef Slot* old = self._slots
        cdef Py_ssize_t n_old = self._n_slots, i
        self._slots = <Slot*>calloc(2 * n_old, sizeof(Slot))
        if self._slots is NULL:
            self._slots = old
            raise MemoryError()
        self._n_slots = 2 * n_old
        self._n_keys = 0
        for i in range(n_old):
            if old[i].used:
                self._put(old[i].key, old[i].worker, old[i].until)
        free(old)
        return 0

    # -- the sends, oldest first ------------------------------------------------------

    cdef int _reserve_ring(self, Py_ssize_t more) except -1:
        """Room in the key ring for ``more`` keys after the kept ones."""
        cdef Py_ssize_t kept_first, kept, size, j
        cdef uint64_t* ring
        kept_first = self._sends[self._sends_head].first if self._n_sends else self._ring_end
        kept = self._ring_end - kept_first
        if kept + more <= self._ring_size:
            return 0
        size = self._ring_size
        while size < kept + more:
            size *= 2
        ring = <uint64_t*>malloc(size * sizeof(uint64_t))
        if ring is NULL:
            raise MemoryError()
        for j in range(kept_first, self._ring_end):  # same positions, new modulus
            ring[j & (size - 1)] = self._ring[j & (self._ring_size - 1)]
        free(self._ring)
        self._ring = ring
        self._ring_size = size
        return 0

    cdef int _reserve_send(self) except -1:
        cdef Send* sends
        cdef Py_ssize_t j
        if self._n_sends < self._sends_size:
            return 0
        sends = <Send*>malloc(2 * self._sends_size * sizeof(Send))
        if sends is NULL:
            raise MemoryError()
        for j in range(self._n_sends):
            sends[j] = self._sends[(self._sends_head + j) & (self._sends_size - 1)]
        free(self._sends)
        self._sends = sends
        self._sends_head = 0
        self._sends_size *= 2
        return 0

    cdef void _prune(self, double now) noexcept:
        """Forget the lapsed sends at the front, then the oldest keys beyond capacity (a
        send's first keys first: a longer prefix outlives its shorter ones)."""
        cdef Send* send
        cdef Py_ssize_t drop, j
        cdef Slot* slot
        while self._n_sends:
            send = &self._sends[self._sends_head]
            if send.until < now:
                drop = send.count
            elif self._recorded > self.capacity:
                drop = min(send.count, self._recorded - self.capacity)
            else:
                return
            for j in range(send.first, send.first + drop):
                slot = self._find(self._ring[j & (self._ring_size - 1)])
                if slot is not NULL and slot.until == send.until:  # not since sent again
                    self._remove(slot)
            self._recorded -= drop
            if drop == send.count:
                self._sends_head = (self._sends_head + 1) & (self._sends_size - 1)
                self._n_sends -= 1
            else:
                send.first += drop
                send.count -= drop
