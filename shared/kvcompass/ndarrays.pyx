# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""numpy arrays over the memory of a ``bytes`` or ``bytearray``, made in C.

The compiled modules hand out the columns and images they fill as numpy arrays: a
worker's event batch has five, a table's patch four to six. ``np.frombuffer`` and
``np.ndarray(shape, dtype, buffer)`` parse their arguments and export the buffer, about
0.25 µs an array; :func:`array_over` makes the same array through numpy's C API
(``PyArray_NewFromDescr``) in about 0.08 µs. Other compiled modules cimport it
(``ndarrays.pxd``); only this one needs numpy's headers. :func:`array_at` is the same
from Python, by offset.
"""

cimport numpy as cnp
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF

import numpy as np

cnp.import_array()

cdef PyTypeObject* _NDARRAY = <PyTypeObject*>np.ndarray

__all__ = ["array_at"]


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
