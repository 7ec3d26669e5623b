# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""numpy arrays over the memory of a ``bytes`` or ``bytearray``, made in C.

The compiled modules hand out the columns and images they fill as numpy arrays: a
worker's event batch has five, a table's patch four to six. ``np.frombuffer`` and
``np.ndarray(shape, dtype, buffer)`` parse their arguments and export the buffer, about
0.25 µs an array; :func:`array_over` makes the same array through numpy's C API
(``PyArray_NewFromDescr``) in about 0.08 µs. The other way, the compiled modules read
arrays through the buffer protocol, where numpy's export builds the format and shape
each time (about 0.1 µs an array); :func:`get_buffer` fills the view from the array's
fields. Other compiled modules cimport both (``ndarrays.pxd``); only this one needs
numpy's headers. :func:`array_at` and :func:`buffer_fields` are the two from Python.
"""

cimport numpy as cnp
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.object cimport Py_TYPE, PyTypeObject
from cpython.ref cimport Py_INCREF, PyObject
from libc.string cimport strchr

from kvcompass.unsigned_items cimport holds_unsigned

import numpy as np

cnp.import_array()

cdef PyTypeObject* _NDARRAY = <PyTypeObject*>np.ndarray
#: numpy's integer type characters, and each as a NUL-terminated buffer format.
cdef const char* _INTEGER_CODES = b"bBhHiIlLqQ"
cdef const char* _INTEGER_FORMATS = b"b\0B\0h\0H\0i\0I\0l\0L\0q\0Q\0"

__all__ = ["array_at", "buffer_fields"]


cdef extern from "Python.h":
    # Py_buffer with its owner as a plain pointer, for a store that releases nothing.
    ctypedef struct _RawBuffer "Py_buffer":
        PyObject* obj


cdef extern from "numpy/arrayobject.h":
    # Declared here with the reference it steals spelled out (numpy's pxd passes the
    # descriptor as a borrowed object).
    object PyArray_NewFromDescr(
        PyTypeObject* subtype, cnp.dtype descr, int nd, cnp.npy_intp* dims,
        cnp.npy_intp* strides, void* data, int flags, object obj,
    )


cdef object array_over(
    object owner, const char* data, object dtype, Py_ssize_t rows, Py_ssize_t width
):
    """A C-contiguous array of ``dtype`` over ``data``, memory of ``owner`` (a ``bytes``:
    read-only, or a ``bytearray``: writable) that the array keeps alive: ``rows`` items,
    or ``(rows, width)`` for a ``width`` above 0. As ``np.frombuffer`` would make it;
    ValueError for anything it would refuse (the memory past ``owner``'s end, another
    owner type, a negative shape); TypeError for a ``dtype`` that is not a numpy dtype."""
    cdef cnp.dtype descr = <cnp.dtype?>dtype
    cdef cnp.npy_intp dims[2]
    cdef int nd = 2 if width > 0 else 1
    cdef int flags
    cdef const char* start
    cdef Py_ssize_t size
    if type(owner) is bytes:
        start, size, flags = PyBytes_AS_STRING(owner), PyBytes_GET_SIZE(owner), 0
    elif type(owner) is bytearray:
        start = PyByteArray_AS_STRING(owner)
        size = PyByteArray_GET_SIZE(owner)
        flags = cnp.NPY_ARRAY_WRITEABLE
    else:
        raise ValueError(f"arrays are made over bytes or bytearray, not {type(owner).__name__}")
    dims[0], dims[1] = rows, width
    if rows < 0 or width < 0 or data < start:
        raise ValueError(f"no array of {rows} x {width} at that address")
    if (data - start) + rows * max(width, 1) * descr.itemsize > size:
        raise ValueError(f"{rows} x {width} items of {descr} run past the owner's end")
    Py_INCREF(descr)  # stolen by PyArray_NewFromDescr
    array = PyArray_NewFromDescr(_NDARRAY, descr, nd, dims, NULL, <void*>data, flags, None)
    cnp.set_array_base(<cnp.ndarray>array, owner)
    return array


def array_at(owner, Py_ssize_t offset, dtype, Py_ssize_t rows, Py_ssize_t width=0):
    """:func:`array_over` the memory of ``owner`` (``bytes`` or ``bytearray``) from
    byte ``offset`` on."""
    cdef const char* start
    if type(owner) is bytes:
        start = PyBytes_AS_STRING(owner)
    elif type(owner) is bytearray:
        start = PyByteArray_AS_STRING(owner)
    else:
        raise ValueError(f"arrays are made over bytes or bytearray, not {type(owner).__name__}")
    if offset < 0:
        raise ValueError(f"offset {offset}")
    return array_over(owner, start + offset, dtype, rows, width)


cdef int get_buffer(object obj, Py_buffer* view, int flags) except -1:
    """``PyObject_GetBuffer(obj, view, flags)``: the same view, release it the same way.
    An aligned C-contiguous numpy array of native integers with the strides numpy would
    export (the batches' columns, the patches' images, the probe rows) is read from its
    fields; anything else is asked for its buffer (including every request this does
    not take: other flags, byte orders or layouts, whose errors are then the
    exporter's own)."""
    cdef cnp.ndarray array
    cdef const char* code
    if Py_TYPE(obj) is not _NDARRAY or flags & ~(
        PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE
    ):
        return PyObject_GetBuffer(obj, view, flags)
    array = <cnp.ndarray>obj
    code = _native_code(<cnp.dtype><object>cnp.PyArray_DESCR(array))
    if (
        code == NULL
        or not cnp.PyArray_ISALIGNED(array)  # numpy exports "=L" then
        or not _canonical(array)
        or (flags & PyBUF_WRITABLE and not cnp.PyArray_ISWRITEABLE(array))
    ):
        return PyObject_GetBuffer(obj, view, flags)
    view.buf = cnp.PyArray_DATA(array)
    # A raw store: the view's fields are uninitialised (an object assignment would
    # release whatever the field held), and the view owns one reference, as
    # PyBuffer_Release expects.
    (<_RawBuffer*>view).obj = <PyObject*>obj
    Py_INCREF(obj)
    view.len = cnp.PyArray_NBYTES(array)
    view.itemsize = cnp.PyArray_ITEMSIZE(array)
    view.readonly = not cnp.PyArray_ISWRITEABLE(array)
    view.ndim = cnp.PyArray_NDIM(array)
    view.format = <char*>code if flags & PyBUF_FORMAT else NULL
    view.shape = <Py_ssize_t*>cnp.PyArray_DIMS(array)
    view.strides = <Py_ssize_t*>cnp.PyArray_STRIDES(array)
    view.suboffsets = NULL
    view.internal = NULL
    return 0


cdef int get_unsigned(object obj, Py_buffer* view, Py_ssize_t size, str name) except -1:
    """:func:`get_buffer` of C-contiguous unsigned items of ``size`` bytes: ValueError
    naming the argument ``name`` otherwise, and nothing held."""
    get_buffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    if not holds_unsigned(view, size):
        PyBuffer_Release(view)
        raise ValueError(f"{name}: expected C-contiguous uint{8 * size}")
    return 0


cdef bint _canonical(cnp.ndarray array) noexcept:
    """Whether the array's strides are those of a C-contiguous layout, which numpy's
    export gives (it rewrites the strides of empty or length-1 axes)."""
    cdef int k
    cdef cnp.npy_intp step = cnp.PyArray_ITEMSIZE(array)
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(array)
    cdef cnp.npy_intp* strides = cnp.PyArray_STRIDES(array)
    for k in range(cnp.PyArray_NDIM(array) - 1, -1, -1):
        if strides[k] != step:
            return False
        step *= dims[k]
    return True


cdef const char* _native_code(cnp.dtype descr) noexcept:
    """The buffer format numpy exports for a native-order integer dtype (NULL: another
    dtype): its type character, from a table of NUL-terminated one-character codes."""
    cdef const char* found
    if descr.byteorder != b"=" and descr.byteorder != b"|":
        return NULL
    found = strchr(_INTEGER_CODES, descr.type)
    if descr.type == 0 or found == NULL:
        return NULL
    return _INTEGER_FORMATS + 2 * (found - _INTEGER_CODES)


def buffer_fields(obj, bint writable=False):
    """What :func:`get_buffer` gives for ``obj`` (C-contiguous, with its format):
    ``(len, itemsize, format, readonly, ndim, shape, strides, obj is the owner)``."""
    cdef Py_buffer view
    cdef int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (PyBUF_WRITABLE if writable else 0)
    get_buffer(obj, &view, flags)
    try:
        return (
            view.len,
            view.itemsize,
            (<bytes>view.format).decode(),
            bool(view.readonly),
            view.ndim,
            tuple(view.shape[i] for i in range(view.ndim)),
            tuple(view.strides[i] for i in range(view.ndim)),
            (<object>(<_RawBuffer*>&view).obj) is obj,
        )
    finally:
        PyBuffer_Release(&view)
