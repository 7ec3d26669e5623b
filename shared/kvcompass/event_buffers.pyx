# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""A publisher's buffered events, per shard, as the columns of the batches they become.

One change of a worker's cache covers a prefix at several lengths whose keys fall in
several shards; each shard's part is one event of that shard's next batch. The buffers
group a change's keys by shard in C and hand each shard's columns over as read-only
numpy arrays made with one copy each. In Python this was work per key, and building a
batch's columns from lists cost more than its few keys.

Every change is checked before anything of it is kept, so the columns taken are valid
by construction and a batch need not check them again: each (kind, tier) pair is one a
:class:`~kvcompass.wire.KVEvent` accepts, each length is 1..2^32-1, each key is 63-bit,
and :meth:`ShardEventBuffers.add` says when a shard holds ``max_events`` events, so the
publisher flushes before a batch would hold more than a message may.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, realloc

import numpy as np

from kvcompass.ndarrays cimport array_over
from kvcompass.shard_hash cimport shard_of_key
from kvcompass.unsigned_items cimport holds_uint32
from kvcompass.xxh3 cimport digest_prefixes

__all__ = ["ShardEventBuffers"]

cdef uint64_t _KEY_MAX = (1ULL << 63) - 1
cdef uint64_t _LENGTH_MAX = (1ULL << 32) - 1
# The wire's column dtypes (little-endian, as the C arrays are on the machines we run).
_KIND_T = np.dtype("u1")
_COUNT_T = np.dtype("<u4")
_KEY_T = np.dtype("<u8")


cdef struct Column:
    char* data
    Py_ssize_t size  # items
    Py_ssize_t capacity  # items


cdef struct ShardEvents:
    Column kinds  # uint8 per event
    Column tiers  # uint8 per event
    Column counts  # uint32 per event
    Column lengths  # uint32 per key
    Column keys  # uint64 per key
    bint pending  # a batch goes out at the next take (even an empty one)


cdef int _reserve(Column* column, Py_ssize_t more, size_t itemsize) except -1:
    cdef Py_ssize_t need = column.size + more
    cdef Py_ssize_t capacity
    cdef char* data
    if need <= column.capacity:
        return 0
    capacity = max(16, 2 * column.capacity, need)
    data = <char*>realloc(column.data, capacity * itemsize)
    if data == NULL:
        raise MemoryError()
    column.data = data
    column.capacity = capacity
    return 0


cdef object _taken(Column* column, size_t itemsize, object dtype):
    """The column as a read-only array of its own bytes; the column is emptied."""
    cdef Py_ssize_t n = column.size
    cdef bytes data = PyBytes_FromStringAndSize(column.data, n * itemsize)
    column.size = 0
    return array_over(data, PyBytes_AS_STRING(data), dtype, n, 0)


cdef bint _valid_pair(int kind, int tier) noexcept:
    """The (kind, tier) pairs KVEvent accepts: ADMIT or TIER (1, 2) into VRAM or DRAM
    (1, 2), EVICT (3) to ABSENT (0)."""
    if kind == 1 or kind == 2:
        return tier == 1 or tier == 2
    return kind == 3 and tier == 0


cdef class ShardEventBuffers:
    """Buffered events of ``n_shards`` shards; ``max_events``: the most one batch holds."""

    cdef ShardEvents* _shards
    cdef Py_ssize_t _n_shards
    cdef Py_ssize_t _max_events
    # One change's keys, lengths and shards, checked before any of it is kept.
    cdef uint64_t* _keys
    cdef uint32_t* _lengths
    cdef Py_ssize_t* _key_shards
    cdef Py_ssize_t _scratch
    # Per shard, the keys of the change being added (all zero between changes).
    cdef uint32_t* _counts
    cdef readonly Py_ssize_t pending_keys

    def __init__(self, Py_ssize_t n_shards, Py_ssize_t max_events):
        if self._shards != NULL:
            raise RuntimeError("ShardEventBuffers.__init__ runs once")
        if n_shards < 1:
            raise ValueError(f"n_shards must be positive, got {n_shards}")
        if max_events < 1:
            raise ValueError(f"max_events must be positive, got {max_events}")
        self._shards = <ShardEvents*>calloc(n_shards, sizeof(ShardEvents))
        self._counts = <uint32_t*>calloc(n_shards, sizeof(uint32_t))
        if self._shards == NULL or self._counts == NULL:
            raise MemoryError()
        self._n_shards = n_shards
        self._max_events = max_events

    def __dealloc__(self):
        cdef Py_ssize_t s
        cdef ShardEvents* shard
        if self._shards != NULL:
            for s in range(self._n_shards):
                shard = &self._shards[s]
                free(shard.kinds.data)
                free(shard.tiers.data)
                free(shard.counts.data)
                free(shard.lengths.data)
                free(shard.keys.data)
            free(self._shards)
        free(self._counts)
        free(self._keys)
        free(self._lengths)
        free(self._key_shards)

    @property
    def n_shards(self):
        return self._n_shards

    @property
    def max_events(self):
        return self._max_events

    cdef int _reserve_scratch(self, Py_ssize_t n) except -1:
        cdef uint64_t* keys
        cdef uint32_t* lengths
        cdef Py_ssize_t* shards
        if n <= self._scratch:
            return 0
        keys = <uint64_t*>realloc(self._keys, n * sizeof(uint64_t))
        if keys != NULL:
            self._keys = keys
        lengths = <uint32_t*>realloc(self._lengths, n * sizeof(uint32_t))
        if lengths != NULL:
            self._lengths = lengths
        shards = <Py_ssize_t*>realloc(self._key_shards, n * sizeof(Py_ssize_t))
        if shards != NULL:
            self._key_shards = shards
        if keys == NULL or lengths == NULL or shards == NULL:
            raise MemoryError()
        self._scratch = n
        return 0

    def add(self, int kind, int tier, object lengths, const uint64_t[:] keys):
        """One change: ``keys[j]`` is the key at ``lengths[j]``, ascending (a sequence of
        ints at least as long as ``keys``; the rest is ignored). Each shard the keys fall
        in gets one event of them, in their order. Returns True when a shard now holds
        ``max_events`` events: flush before the next change. A change that fails a check
        raises ValueError and adds nothing."""
        cdef Py_ssize_t n = keys.shape[0]
        cdef Py_ssize_t j = 0
        cdef object length
        if not _valid_pair(kind, tier):
            raise ValueError(f"kind {kind} with tier {tier} is not a valid event")
        if len(lengths) < n:
            raise ValueError(f"{n} keys but {len(lengths)} lengths")
        self._reserve_scratch(n)
        for length in lengths:
            if j == n:
                break
            self._lengths[j] = _checked_length(length)
            self._keys[j] = _checked_key(keys[j])
            j += 1
        return self._add(<uint8_t>kind, <uint8_t>tier, n)

    def add_one(self, int kind, int tier, object length, uint64_t key):
        """:meth:`add` of one key (a demotion or an eviction: one length, one shard)."""
        if not _valid_pair(kind, tier):
            raise ValueError(f"kind {kind} with tier {tier} is not a valid event")
        self._reserve_scratch(1)
        self._lengths[0] = _checked_length(length)
        self._keys[0] = _checked_key(key)
        return self._add(<uint8_t>kind, <uint8_t>tier, 1)

    def add_prefixes(self, int kind, int tier, bytes head, object tokens, object lengths):
        """One change keyed here: the prefixes of ``tokens`` (a C-contiguous buffer of
        uint32 token ids) at the ascending ``lengths`` up to the prompt's length, each
        keyed ``XXH3-64(head + its tokens' bytes) & (2^63 - 1)``, as
        :class:`~kvcompass.keys.PrefixHasher` keys them with ``head`` its
        :attr:`~kvcompass.keys.PrefixHasher.head`. Then as :meth:`add`. TypeError:
        ``tokens`` is not such a buffer (and nothing was added)."""
        cdef Py_buffer view
        cdef Py_ssize_t n_items, n = 0
        cdef uint32_t length, previous = 0
        if not _valid_pair(kind, tier):
            raise ValueError(f"kind {kind} with tier {tier} is not a valid event")
        try:
            PyObject_GetBuffer(tokens, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        except (BufferError, TypeError, ValueError) as exc:
            raise TypeError(f"tokens must be a C-contiguous uint32 buffer: {exc}") from None
        try:
            if not holds_uint32(&view):
                raise TypeError(f"tokens must hold uint32 items, not {view.format!r}")
            n_items = view.len // 4
            self._reserve_scratch(len(lengths))
            for item in lengths:
                length = _checked_length(item)
                if length > n_items:
                    break
                if length < previous:
                    raise ValueError(f"lengths must ascend: {length} after {previous}")
                self._lengths[n] = length
                previous = length
                n += 1
            digest_prefixes(
                <const char*>head, len(head), <const char*>view.buf, self._lengths, n,
                _KEY_MAX, self._keys,
            )
        finally:
            PyBuffer_Release(&view)
        return self._add(<uint8_t>kind, <uint8_t>tier, n)

    cdef bint _add(self, uint8_t kind, uint8_t tier, Py_ssize_t n) except -1:
        """Group the checked scratch keys by shard and append one event per shard."""
        cdef Py_ssize_t j, s
        cdef ShardEvents* shard
        cdef uint32_t count
        cdef bint full = False
        for j in range(n):
            s = shard_of_key(self._keys[j], <uint64_t>self._n_shards)
            self._key_shards[j] = s
            self._counts[s] += 1
        try:
            # Room first: a change is added whole or not at all.
            for j in range(n):
                s = self._key_shards[j]
                shard = &self._shards[s]
                if shard.kinds.size >= self._max_events:
                    raise ValueError(
                        f"shard {s} already holds {self._max_events} events: flush first"
                    )
                _reserve(&shard.kinds, 1, 1)
                _reserve(&shard.tiers, 1, 1)
                _reserve(&shard.counts, 1, 4)
                _reserve(&shard.lengths, self._counts[s], 4)
                _reserve(&shard.keys, self._counts[s], 8)
        except BaseException:
            for j in range(n):
                self._counts[self._key_shards[j]] = 0
            raise
        for j in range(n):
            s = self._key_shards[j]
            shard = &self._shards[s]
            (<uint32_t*>shard.lengths.data)[shard.lengths.size] = self._lengths[j]
            (<uint64_t*>shard.keys.data)[shard.keys.size] = self._keys[j]
            shard.lengths.size += 1
            shard.keys.size += 1
        for j in range(n):
            s = self._key_shards[j]
            count = self._counts[s]
            if count == 0:  # this shard's event is in already
                continue
            self._counts[s] = 0
            shard = &self._shards[s]
            (<uint8_t*>shard.kinds.data)[shard.kinds.size] = kind
            (<uint8_t*>shard.tiers.data)[shard.tiers.size] = tier
            (<uint32_t*>shard.counts.data)[shard.counts.size] = count
            shard.kinds.size += 1
            shard.tiers.size += 1
            shard.counts.size += 1
            shard.pending = True
            full = full or shard.kinds.size >= self._max_events
        self.pending_keys += n
        return full

    def mark_all(self):
        """Every shard sends a batch at the next :meth:`take`, empty if it has no events."""
        cdef Py_ssize_t s
        for s in range(self._n_shards):
            self._shards[s].pending = True

    def take(self):
        """Every pending shard's columns, in shard order: a list of ``(shard, kinds,
        tiers, counts, lengths, keys)``, read-only arrays in the wire's dtypes. The
        buffers are empty after."""
        cdef Py_ssize_t s
        cdef ShardEvents* shard
        taken = []
        for s in range(self._n_shards):
            shard = &self._shards[s]
            if not shard.pending:
                continue
            shard.pending = False
            taken.append(
                (
                    s,
                    _taken(&shard.kinds, 1, _KIND_T),
                    _taken(&shard.tiers, 1, _KIND_T),
                    _taken(&shard.counts, 4, _COUNT_T),
                    _taken(&shard.lengths, 4, _COUNT_T),
                    _taken(&shard.keys, 8, _KEY_T),
                )
            )
        self.pending_keys = 0
        return taken

    def discard(self):
        """Drop every buffered event; returns how many keys were dropped."""
        cdef Py_ssize_t s
        cdef ShardEvents* shard
        cdef Py_ssize_t dropped = self.pending_keys
        for s in range(self._n_shards):
            shard = &self._shards[s]
            shard.pending = False
            shard.kinds.size = shard.tiers.size = shard.counts.size = 0
            shard.lengths.size = shard.keys.size = 0
        self.pending_keys = 0
        return dropped


cdef uint32_t _checked_length(object length) except? 0:
    cdef long long value = length
    if value < 1 or <unsigned long long>value > _LENGTH_MAX:
        raise ValueError(f"length {length} is outside 1..{_LENGTH_MAX}")
    return <uint32_t>value


cdef uint64_t _checked_key(uint64_t key) except? 0:
    if key > _KEY_MAX:
        raise ValueError(f"key {key} is not a 63-bit key")
    return key
