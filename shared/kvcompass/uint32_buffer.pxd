# Whether a buffer holds uint32 items (a token array), for the compiled modules that read
# prompts through the buffer protocol: native ("I", "=I") or little-endian ("<I") codes,
# which are the same bytes on the little-endian hosts these modules run on.

from cpython.buffer cimport Py_buffer
from libc.string cimport strcmp


cdef inline bint holds_uint32(const Py_buffer* view) noexcept:
    return view.itemsize == 4 and view.format != NULL and (
        strcmp(view.format, b"I") == 0
        or strcmp(view.format, b"=I") == 0
        or strcmp(view.format, b"<I") == 0
    )
