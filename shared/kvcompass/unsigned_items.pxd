# Whether a buffer holds unsigned integers of a given size, for the compiled modules that
# take arrays through the buffer protocol instead of typed memoryviews (which build a
# memoryview object per argument: about 0.15 µs each). Native ("I"), native-aligned
# ("@I"), native-sized ("=I") or little-endian ("<I") codes are all the same bytes on
# the little-endian hosts these modules run on; the item size is the buffer's own.

from cpython.buffer cimport Py_buffer


cdef inline bint holds_unsigned(const Py_buffer* view, Py_ssize_t size) noexcept:
    cdef const char* code = view.format
    if view.itemsize != size or code == NULL:
        return False
    if code[0] == b"@" or code[0] == b"=" or code[0] == b"<":
        code += 1
    return code[0] != 0 and code[1] == 0 and code[0] in b"BHILQ"


cdef inline bint holds_uint32(const Py_buffer* view) noexcept:
    return holds_unsigned(view, 4)
