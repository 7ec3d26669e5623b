# The shard of a key in C, for the compiled modules that group or check keys by shard:
# mix64(key ^ SHARD_SALT) mod n_shards, bit-identical to kvcompass.keys.shard_of
# (tests/unit/test_event_buffers.py holds it there). uint64 arithmetic wraps in C.

cimport cython
from libc.stdint cimport uint64_t


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """MurmurHash3 fmix64 (kvcompass.hashing.mix64)."""
    x ^= x >> 33
    x *= 0xFF51AFD7ED558CCDULL
    x ^= x >> 33
    x *= 0xC4CEB9FE1A85EC53ULL
    return x ^ (x >> 33)


@cython.cdivision(True)
cdef inline Py_ssize_t shard_of_key(uint64_t key, uint64_t n_shards) noexcept nogil:
    """The shard owning ``key``; ``n_shards`` >= 1 (the callers check it once)."""
    return <Py_ssize_t>(mix64(key ^ 0x57C1A949D4BAC399ULL) % n_shards)
