# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""A region's (length, key) pairs out of a planner's keys, built in C.

A decision asks for its own region's pairs (pending credit, its record, the migration
check): a few tuples of a length and a 63-bit key. Built by a list comprehension over
the planner's key array, they cost about a microsecond a request, cold.
"""

from cpython.buffer cimport PyBuffer_Release
from libc.stdint cimport uint64_t

from kvcompass.ndarrays cimport get_unsigned

__all__ = ["region_pairs"]


def region_pairs(tuple planned, keys):
    """``[(length, keys[at]) for length, at in planned if at < len(keys)]``: ``planned``
    the region's ``(length, position)`` pairs, ``keys`` C-contiguous uint64 (ValueError
    otherwise)."""
    cdef Py_buffer view
    cdef const uint64_t* at_keys
    cdef Py_ssize_t n, at
    cdef list out = []
    get_unsigned(keys, &view, 8, "keys")
    try:
        at_keys = <const uint64_t*>view.buf
        n = view.len // 8
        for length, position in planned:
            at = position
            if 0 <= at < n:
                out.append((length, at_keys[at]))
        return out
    finally:
        PyBuffer_Release(&view)
