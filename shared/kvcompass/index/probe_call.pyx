# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""A query's probes run by the match kernel's C entry, its arrays taken as buffers.

:func:`match` is :func:`kvcompass.index.probe.match_probes` called from C
(:mod:`kvcompass.index.probe_entry`): each array's buffer is checked for its type and
shape here, where numba's dispatcher unboxed them from Python. A reader that matches
into the same arrays every time checks them once, as a :class:`MatchTarget`, and calls
:func:`match_at` with a query's keys and probes alone (numpy's buffer export costs about
0.1 µs an array). The entry is bound on the first match (importing it compiles the
kernel, or loads it from numba's cache).
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.buffer cimport PyBuffer_Release
from libc.stdint cimport int64_t, uint64_t, uintptr_t

from kvcompass.ndarrays cimport get_buffer

__all__ = ["N_COLUMNS", "MatchTarget", "match", "match_at"]

ctypedef void (*_MatchAt)(
    uint64_t, int64_t, int64_t, uint64_t, int64_t, uint64_t, int64_t, uint64_t, int64_t,
    uint64_t, uint64_t, int64_t, uint64_t, int64_t,
) noexcept nogil

cdef _MatchAt _entry = NULL

cdef enum:
    _DESC, _KEYS, _PROBES, _WORKERS, _LENGTHS, _TIERS, _TOUCHED, _N_ARRAYS
    _N_COLUMNS = 13  # probe.N_COLUMNS (a unit test holds them equal)


#: Columns of a descriptor row as read here (kvcompass.index.probe.N_COLUMNS).
N_COLUMNS = _N_COLUMNS


cdef int _bind() except -1:
    global _entry
    from kvcompass.index.probe_entry import match_at_address

    _entry = <_MatchAt><uintptr_t>match_at_address()
    return 0


cdef bint _is_8_bytes(Py_buffer* view, bytes codes) noexcept:
    """Items of 8 bytes whose (native) format code is one of ``codes``."""
    return (
        view.itemsize == 8 and view.format != NULL and view.format[0] != 0
        and view.format[1] == 0 and view.format[0] in codes
    )


cdef class MatchTarget:
    """Where a reader's matches land: its descriptor rows, table workers, per-worker
    outputs and per-shard marks, checked once (as :func:`match` checks them) and then
    held, so that :func:`match_at` takes only a query's keys and probes as buffers."""

    cdef object _arrays  # keeps every array below alive
    cdef uint64_t _desc, _workers, _lengths, _tiers, _touched
    cdef int64_t _n_rows, _n_tables, _n_fields, _n_workers, _n_shards

    def __init__(self, desc, Py_ssize_t n_tables, workers, lengths, tiers, touched):
        cdef Py_buffer views[_N_ARRAYS]
        cdef bint held[_N_ARRAYS]
        cdef int k
        arrays = (desc, None, None, workers, lengths, tiers, touched)
        for k in range(_N_ARRAYS):
            held[k] = False
        try:
            for k in range(_N_ARRAYS):
                if arrays[k] is None:
                    continue
                flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
                if k >= _LENGTHS:
                    flags |= PyBUF_WRITABLE
                get_buffer(arrays[k], &views[k], flags)
                held[k] = True
            n_rows = views[_DESC].len // (8 * _N_COLUMNS)
            n_workers = views[_LENGTHS].len // 8
            n_fields = views[_WORKERS].len // (8 * n_tables) if n_tables > 0 else 0
            if not (
                _is_8_bytes(&views[_DESC], b"LQ") and views[_DESC].len == 8 * _N_COLUMNS * n_rows
            ):
                raise ValueError("desc: expected uint64 rows of N_COLUMNS")
            if n_tables < 1 or n_rows < n_tables or n_rows % n_tables:
                raise ValueError(f"{n_rows} descriptor rows are not shards of {n_tables} tables")
            if not (
                _is_8_bytes(&views[_WORKERS], b"lq")
                and views[_WORKERS].len == 8 * n_tables * n_fields
            ):
                raise ValueError("workers: expected int64 rows, one per table")
            if not (
                _is_8_bytes(&views[_LENGTHS], b"lq") and _is_8_bytes(&views[_TIERS], b"lq")
                and views[_TIERS].len == views[_LENGTHS].len
            ):
                raise ValueError("lengths and tiers: expected int64, one per worker")
            if not (
                views[_TOUCHED].itemsize == 1 and views[_TOUCHED].format != NULL
                and views[_TOUCHED].format[0] == b"B"[0]
                and views[_TOUCHED].len == n_rows // n_tables
            ):
                raise ValueError("touched: expected uint8, one per shard")
            self._desc = <uint64_t><uintptr_t>views[_DESC].buf
            self._workers = <uint64_t><uintptr_t>views[_WORKERS].buf
            self._lengths = <uint64_t><uintptr_t>views[_LENGTHS].buf
            self._tiers = <uint64_t><uintptr_t>views[_TIERS].buf
            self._touched = <uint64_t><uintptr_t>views[_TOUCHED].buf
            self._n_rows, self._n_tables, self._n_fields = n_rows, n_tables, n_fields
            self._n_workers, self._n_shards = n_workers, n_rows // n_tables
            self._arrays = arrays
        finally:
            for k in range(_N_ARRAYS):
                if held[k]:
                    PyBuffer_Release(&views[k])

    def lists(self):
        """The per-worker outputs as lists of ints, as ``lengths.tolist()`` and
        ``tiers.tolist()`` give them: a list of zeros with the few matched workers set
        (numpy converts every item through its dtype's getter, about 0.3 µs a list)."""
        return (
            _int_list(<const int64_t*><uintptr_t>self._lengths, self._n_workers),
            _int_list(<const int64_t*><uintptr_t>self._tiers, self._n_workers),
        )


cdef list _int_list(const int64_t* values, Py_ssize_t n):
    cdef list out = [0] * n
    cdef Py_ssize_t i
    for i in range(n):
        if values[i] != 0:
            out[i] = values[i]
    return out


def match_at(MatchTarget target, keys, probes):
    """:func:`match` into a checked target: ``keys`` 63-bit keys as int64 or uint64,
    ``probes`` int64 rows of 4, both C-contiguous (ValueError naming the first that is
    not). The target's arrays must keep their memory (none may be resized)."""
    cdef Py_buffer key_view, probe_view
    get_buffer(keys, &key_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        get_buffer(probes, &probe_view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        try:
            if not _is_8_bytes(&key_view, b"lqLQ"):
                raise ValueError("keys: expected 8-byte integers")
            if not (_is_8_bytes(&probe_view, b"lq") and probe_view.len % 32 == 0):
                raise ValueError("probes: expected int64 rows of 4")
            if _entry == NULL:
                _bind()
            _entry(
                target._desc, target._n_rows, target._n_tables,
                <uint64_t><uintptr_t>key_view.buf, key_view.len // 8,
                <uint64_t><uintptr_t>probe_view.buf, probe_view.len // 32,
                target._workers, target._n_fields, target._lengths, target._tiers,
                target._n_workers, target._touched, target._n_shards,
            )
        finally:
            PyBuffer_Release(&probe_view)
    finally:
        PyBuffer_Release(&key_view)


def match(desc, Py_ssize_t n_tables, keys, probes, workers, lengths, tiers, touched):
    """:func:`~kvcompass.index.probe.match_probes` of the same arguments, run from C:
    ``desc`` uint64 rows of ``N_COLUMNS``, ``keys`` 63-bit keys as int64 or uint64,
    ``probes`` int64 rows of 4, ``workers`` int64 (tables, fields), ``lengths`` and
    ``tiers`` writable int64 per worker, ``touched`` writable uint8 per shard; all
    C-contiguous (ValueError naming the first that is not as described)."""
    match_at(MatchTarget(desc, n_tables, workers, lengths, tiers, touched), keys, probes)
