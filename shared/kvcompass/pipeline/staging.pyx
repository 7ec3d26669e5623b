# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""A shard writer's accepted writes, per table, waiting for one kernel call per table.

A maintenance unit reads several event batches at once, each often a few keys; a
table's writes are staged as they are accepted and written together. Every key of a
batch becomes ``value := (value & ~clear) | bits`` with ``clear`` the worker's 2-bit
field and ``bits`` its event's tier in that field. Staging appends the key and both
masks to the table's columns in C, where numpy built two filled arrays per batch and
concatenated them per table; the shard check of a batch's keys runs here too.
"""

from cpython.buffer cimport PyBuffer_Release
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free

import numpy as np

from kvcompass.ndarrays cimport get_unsigned
from kvcompass.shard_hash cimport shard_of_key

__all__ = ["StagedWrites"]


cdef class StagedWrites:
    """Staged writes of the ``n_tables`` tables of shard ``shard`` of ``n_shards``."""

    cdef list _arrays  # per table: its keys, clear and bits columns (numpy, with room)
    cdef uint64_t** _columns  # per table, 3 pointers: into those arrays' data
    cdef Py_ssize_t* _sizes  # per table: staged writes
    cdef Py_ssize_t* _capacity  # per table
    cdef Py_ssize_t* _order  # tables in the order of their first staged write
    cdef Py_ssize_t _n_order
    cdef Py_ssize_t _n_tables
    cdef uint64_t _n_shards
    cdef Py_ssize_t _shard

    def __init__(self, Py_ssize_t n_tables, Py_ssize_t n_shards, Py_ssize_t shard):
        if self._sizes != NULL:
            raise RuntimeError("StagedWrites.__init__ runs once")
        if n_tables < 1 or n_shards < 1 or not 0 <= shard < n_shards:
            raise ValueError(f"{n_tables} tables, shard {shard} of {n_shards}")
        self._columns = <uint64_t**>calloc(3 * n_tables, sizeof(uint64_t*))
        self._sizes = <Py_ssize_t*>calloc(n_tables, sizeof(Py_ssize_t))
        self._capacity = <Py_ssize_t*>calloc(n_tables, sizeof(Py_ssize_t))
        self._order = <Py_ssize_t*>calloc(n_tables, sizeof(Py_ssize_t))
        if (
            self._columns == NULL or self._sizes == NULL
            or self._capacity == NULL or self._order == NULL
        ):
            raise MemoryError()
        self._arrays = [None] * n_tables
        self._n_tables = n_tables
        self._n_shards = <uint64_t>n_shards
        self._shard = shard

    def __dealloc__(self):
        free(self._columns)
        free(self._sizes)
        free(self._capacity)
        free(self._order)

    def first_foreign(self, keys):
        """Index of the first of ``keys`` (C-contiguous uint64) not of this shard
        (:func:`kvcompass.keys.shard_of`), -1 if every key is: the one check of every
        batch a shard's writer accepts."""
        cdef Py_buffer view
        cdef const uint64_t* at
        cdef Py_ssize_t j
        get_unsigned(keys, &view, 8, "keys")
        try:
            at = <const uint64_t*>view.buf
            for j in range(view.len // 8):
                if shard_of_key(at[j], self._n_shards) != self._shard:
                    return j
            return -1
        finally:
            PyBuffer_Release(&view)

    def add(self, Py_ssize_t table_id, int field, keys, tiers, counts):
        """Stage a checked batch's keys for ``table_id``, the worker's ``field`` there:
        ``counts[i]`` consecutive keys take ``tiers[i]`` (the batch's columns: C-contiguous
        uint64, uint8 and uint32)."""
        cdef Py_buffer views[3]
        cdef int held = 0
        try:
            get_unsigned(keys, &views[0], 8, "keys")
            held = 1
            get_unsigned(tiers, &views[1], 1, "tiers")
            held = 2
            get_unsigned(counts, &views[2], 4, "counts")
            held = 3
            self._add(
                table_id, field, <const uint64_t*>views[0].buf, views[0].len // 8,
                <const uint8_t*>views[1].buf, <const uint32_t*>views[2].buf,
                views[1].len, views[2].len // 4,
            )
        finally:
            while held:
                held -= 1
                PyBuffer_Release(&views[held])

    cdef int _add(
        self, Py_ssize_t table_id, int field, const uint64_t* keys, Py_ssize_t n,
        const uint8_t* tiers, const uint32_t* counts, Py_ssize_t n_tiers, Py_ssize_t n_counts,
    ) except -1:
        cdef Py_ssize_t size, i, j = 0, end
        cdef uint64_t* staged_keys
        cdef uint64_t* staged_clear
        cdef uint64_t* staged_bits
        cdef int shift = 2 * field
        cdef uint64_t clear = 3ULL << shift
        cdef uint64_t bits
        if not 0 <= table_id < self._n_tables:
            raise ValueError(f"no table {table_id}")
        if not 0 <= shift <= 62:
            raise ValueError(f"no field {field} in a 64-bit value")
        if n_tiers != n_counts:
            raise ValueError(f"{n_tiers} tiers but {n_counts} key counts")
        for i in range(n_tiers):
            if tiers[i] > 3:
                raise ValueError(f"tier {tiers[i]} does not fit a 2-bit field")
            j += counts[i]
        if j != n:
            raise ValueError(f"key counts add up to {j}, but there are {n} keys")
        if n == 0:
            return 0
        self._reserve(table_id, n)
        size = self._sizes[table_id]
        if size == 0:
            self._order[self._n_order] = table_id
            self._n_order += 1
        staged_keys = self._columns[3 * table_id] + size
        staged_clear = self._columns[3 * table_id + 1] + size
        staged_bits = self._columns[3 * table_id + 2] + size
        j = 0
        for i in range(n_tiers):
            bits = (<uint64_t>tiers[i]) << shift
            end = j + counts[i]
            while j < end:
                staged_keys[j] = keys[j]
                staged_clear[j] = clear
                staged_bits[j] = bits
                j += 1
        self._sizes[table_id] = size + n
        return 0

    cdef int _reserve(self, Py_ssize_t table_id, Py_ssize_t more) except -1:
        cdef Py_ssize_t size = self._sizes[table_id]
        cdef Py_ssize_t capacity = self._capacity[table_id]
        cdef uint64_t[::1] data
        cdef int c
        if size + more <= capacity:
            return 0
        capacity = max(64, 2 * capacity, size + more)
        old = self._arrays[table_id]
        new = tuple(np.empty(capacity, dtype=np.uint64) for _ in range(3))
        for c in range(3):
            if size:
                new[c][:size] = old[c][:size]
            data = new[c]
            self._columns[3 * table_id + c] = &data[0]
        self._arrays[table_id] = new
        self._capacity[table_id] = capacity
        return 0

    def take(self):
        """Every table's staged writes, tables in the order of their first staged write:
        a list of ``(table_id, keys, clear, bits, n)``, the addresses of ``n`` staged
        uint64 keys and masks each (for the write kernel's C entry: no array is made),
        valid until the next :meth:`add`. Nothing is staged after."""
        cdef Py_ssize_t k, table_id
        cdef uint64_t** columns
        taken = []
        for k in range(self._n_order):
            table_id = self._order[k]
            columns = self._columns + 3 * table_id
            taken.append((
                table_id,
                <uintptr_t>columns[0],
                <uintptr_t>columns[1],
                <uintptr_t>columns[2],
                self._sizes[table_id],
            ))
            self._sizes[table_id] = 0
        self._n_order = 0
        return taken
