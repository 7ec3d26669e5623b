# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""A query's probes run by the match kernel's C entry, its arrays taken as buffers.

:func:`match` is :func:`kvcompass.index.probe.match_probes` called from C
(:mod:`kvcompass.index.probe_entry`): each array's buffer is checked for its type and
shape here, where numba's dispatcher unboxed them from Python. The entry is bound on
the first match (importing it compiles the kernel, or loads it from numba's cache).
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.buffer cimport PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint64_t, uintptr_t

__all__ = ["N_COLUMNS", "match"]

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


def match(desc, Py_ssize_t n_tables, keys, probes, workers, lengths, tiers, touched):
    """:func:`~kvcompass.index.probe.match_probes` of the same arguments, run from C:
    ``desc`` uint64 rows of ``N_COLUMNS``, ``keys`` 63-bit keys as int64 or uint64,
    ``probes`` int64 rows of 4, ``workers`` int64 (tables, fields), ``lengths`` and
    ``tiers`` writable int64 per worker, ``touched`` writable uint8 per shard; all
    C-contiguous (ValueError naming the first that is not as described)."""
    cdef Py_buffer views[_N_ARRAYS]
    cdef bint held[_N_ARRAYS]
    cdef int k
    arrays = (desc, keys, probes, workers, lengths, tiers, touched)
    for k in range(_N_ARRAYS):
        held[k] = False
    try:
        for k in range(_N_ARRAYS):
            flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
            if k >= _LENGTHS:
                flags |= PyBUF_WRITABLE
            PyObject_GetBuffer(arrays[k], &views[k], flags)
            held[k] = True
        n_rows = views[_DESC].len // (8 * _N_COLUMNS)
        n_probes = views[_PROBES].len // 32
        n_workers = views[_LENGTHS].len // 8
        n_fields = views[_WORKERS].len // (8 * n_tables) if n_tables > 0 else 0
        if not (_is_8_bytes(&views[_DESC], b"LQ") and views[_DESC].len == 8 * _N_COLUMNS * n_rows):
            raise ValueError("desc: expected uint64 rows of N_COLUMNS")
        if n_tables < 1 or n_rows < n_tables or n_rows % n_tables:
            raise ValueError(f"{n_rows} descriptor rows are not shards of {n_tables} tables")
        if not _is_8_bytes(&views[_KEYS], b"lqLQ"):
            raise ValueError("keys: expected 8-byte integers")
        if not (_is_8_bytes(&views[_PROBES], b"lq") and views[_PROBES].len == 32 * n_probes):
            raise ValueError("probes: expected int64 rows of 4")
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
        if _entry == NULL:
            _bind()
        _entry(
            <uint64_t><uintptr_t>views[_DESC].buf, n_rows, n_tables,
            <uint64_t><uintptr_t>views[_KEYS].buf, views[_KEYS].len // 8,
            <uint64_t><uintptr_t>views[_PROBES].buf, n_probes,
            <uint64_t><uintptr_t>views[_WORKERS].buf, n_fields,
            <uint64_t><uintptr_t>views[_LENGTHS].buf, <uint64_t><uintptr_t>views[_TIERS].buf,
            n_workers, <uint64_t><uintptr_t>views[_TOUCHED].buf, n_rows // n_tables,
        )
    finally:
        for k in range(_N_ARRAYS):
            if held[k]:
                PyBuffer_Release(&views[k])
