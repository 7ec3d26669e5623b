# numpy arrays over memory a Python object owns, and numpy arrays' memory as buffers,
# through numpy's C API (ndarrays.pyx).

from cpython.buffer cimport Py_buffer

cdef object array_over(
    object owner, const char* data, object dtype, Py_ssize_t rows, Py_ssize_t width
)


cdef int get_buffer(object obj, Py_buffer* view, int flags) except -1

cdef int get_unsigned(object obj, Py_buffer* view, Py_ssize_t size, str name) except -1
