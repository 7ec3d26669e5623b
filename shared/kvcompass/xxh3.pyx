# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
# distutils: define_macros = XXH_INLINE_ALL
"""XXH3-64 of every prefix of one byte string at given lengths, in one call.

A prompt's keys are the digests of its prefixes at a few dozen lengths. Driving the
xxhash package's streaming state from Python costs an update and a digest per length,
more than the hashing (6 µs for a 3,400-token prompt at 35 lengths). Here one call runs
the same streaming state of the xxHash C library (its header, ``libxxhash-dev``, built
in): an update per length and a digest of a copy, so the string is read once. Every
digest equals ``xxhash.xxh3_64_intdigest`` of the same bytes (property tests pin it).

The input is a head of bytes (a namespace's fixed encoding) followed by a body of
uint32 items (the tokens), hashed as the host's bytes of the items: little-endian hosts
only, where those are the tokens' little-endian encoding.
"""

from cpython cimport array as carray
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc

from kvcompass.unsigned_items cimport holds_uint32

from array import array

__all__ = ["digests_at"]

#: The digests' type: an array of this typecode is made in C from it (a numpy array
#: from a buffer cost about 1 µs, a tenth of a request's key planning).
cdef carray.array _UINT64S = array("Q")


cdef extern from "xxhash.h" nogil:
    ctypedef unsigned long long XXH64_hash_t
    ctypedef struct XXH3_state_t:
        pass
    int XXH3_64bits_reset(XXH3_state_t* state)
    int XXH3_64bits_update(XXH3_state_t* state, const void* data, size_t length)
    XXH64_hash_t XXH3_64bits_digest(const XXH3_state_t* state)


def digests_at(bytes head, object body, object ends, uint64_t mask):
    """``XXH3-64(head + body[:end]) & mask`` for each of the ascending ``ends`` (item
    counts) up to the first one past the body, as an ``array("Q")``. ``body``: a
    C-contiguous buffer of uint32 items (a token array); anything else raises
    TypeError (or the buffer protocol's ValueError or BufferError)."""
    cdef Py_buffer view
    cdef Py_ssize_t n_items, count = 0, done = 0, end
    cdef uint32_t* counted = NULL
    cdef carray.array digests
    PyObject_GetBuffer(body, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        if not holds_uint32(&view):
            raise TypeError(f"the body must hold uint32 items, not {view.format!r}")
        n_items = view.len // 4
        ends = tuple(ends)
        counted = <uint32_t*>malloc((len(ends) + 1) * sizeof(uint32_t))
        if counted == NULL:
            raise MemoryError()
        for end in ends:
            if end > n_items:
                break
            if end < done:
                raise ValueError(f"ends must ascend: {end} after {done}")
            done = end
            counted[count] = <uint32_t>end
            count += 1
        digests = carray.clone(_UINT64S, count, False)
        digest_prefixes(
            <const char*>head, len(head), <const char*>view.buf, counted, count, mask,
            <uint64_t*>digests.data.as_ulonglongs,
        )
        return digests
    finally:
        free(counted)
        PyBuffer_Release(&view)


cdef void digest_prefixes(
    const char* head, size_t head_length, const char* body, const uint32_t* ends,
    Py_ssize_t count, uint64_t mask, uint64_t* out,
) noexcept nogil:
    """``out[j] = XXH3-64(head + body[:4 * ends[j]]) & mask``: one streaming state, an
    update per end and a digest of a copy. ``ends`` ascend, each within ``body``."""
    cdef XXH3_state_t state
    cdef Py_ssize_t j
    cdef size_t done = 0, end
    XXH3_64bits_reset(&state)
    XXH3_64bits_update(&state, head, head_length)
    for j in range(count):
        end = ends[j]
        XXH3_64bits_update(&state, body + 4 * done, 4 * (end - done))
        out[j] = XXH3_64bits_digest(&state) & mask
        done = end
