# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""A table's writes given by address, run by the write kernel's C entry point.

:mod:`kvcompass.index.write_entry` compiles the kernel as a C function; calling it from
here costs a C call, where calling the numba kernel from Python unboxes eight
arguments. The entry is bound on the first write (importing it compiles the kernel, or
loads it from numba's cache).
"""

from libc.stdint cimport int64_t, uint64_t, uintptr_t

__all__ = ["write_at"]

ctypedef int64_t (*_WriteAt)(
    uint64_t, uint64_t, int64_t, uint64_t, int64_t, uint64_t,
    uint64_t, uint64_t, uint64_t, int64_t, int64_t,
) noexcept nogil

cdef _WriteAt _entry = NULL


cdef int _bind() except -1:
    global _entry
    from kvcompass.index.write_entry import write_at_address

    _entry = <_WriteAt><uintptr_t>write_at_address()
    return 0


def write_at(
    tuple target, uint64_t keys, uint64_t clear, uint64_t bits, int64_t n, int64_t start
):
    """Run ``value := (value & ~clear[i]) | bits[i]`` for ``keys[start:n]`` of one table,
    in order, as :func:`kvcompass.index.kernel.apply_writes` does: returns its
    ``(status, index)``. ``target``: the table's ``(descriptor, cells, cell bytes,
    fingerprints, fingerprint bytes, geometry)`` addresses and sizes; ``keys``,
    ``clear`` and ``bits``: addresses of ``n`` checked uint64 columns. The caller keeps
    every array alive and in place during the call."""
    cdef uint64_t desc, cells, fps, geo
    cdef int64_t cell_bytes, fp_bytes, result
    desc, cells, cell_bytes, fps, fp_bytes, geo = target
    if not (cell_bytes == 4 or cell_bytes == 8) or not (fp_bytes == 1 or fp_bytes == 2):
        raise ValueError(f"cells of {cell_bytes} and fingerprints of {fp_bytes} bytes")
    if not 0 <= start <= n < (1 << 32):
        raise ValueError(f"writes {start}..{n}")
    if _entry == NULL:
        _bind()
    result = _entry(desc, cells, cell_bytes, fps, fp_bytes, geo, keys, clear, bits, n, start)
    return result >> 32, result & 0xFFFFFFFF
