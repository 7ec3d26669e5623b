# numpy arrays over memory a Python object owns, made through numpy's C API (ndarrays.pyx).

cdef object array_over(
    object owner, const char* data, object dtype, Py_ssize_t rows, Py_ssize_t width
)
