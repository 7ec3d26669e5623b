# The XXH3 digests' C interface, for the compiled modules that key prefixes themselves
# (event_buffers.pyx): the same digests as xxh3.digests_at, without Python objects.

from libc.stdint cimport uint32_t, uint64_t


cdef void digest_prefixes(
    const char* head, size_t head_length, const char* body, const uint32_t* ends,
    Py_ssize_t count, uint64_t mask, uint64_t* out,
) noexcept nogil
