# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""A table's patch taken, and a view's patch applied, as one compiled call each.

A patch is the final state of the buckets and Othello words a table's writes touched
since the last one (:mod:`kvcompass.index.patches`). With numpy, taking one cost a
dozen calls (copy the dirty lists, clear their flags, gather seeds, cell rows,
fingerprint rows and words) and applying one four scatters: each a microsecond, for a
patch of a few buckets. Here each side is one pass over the dirty buckets and words.

Both work on memory described by address (:mod:`kvcompass.index.addresses`): the
table's arrays through its write descriptor, the view's through the addresses of its
image, which the caller keeps alive and in place while it calls.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint64_t, uintptr_t
from libc.string cimport memcpy, strcmp

from kvcompass.ndarrays cimport array_over, get_buffer

import numpy as np

from kvcompass.frozen_init import field_builder
from kvcompass.index.patches import BucketImages, WordImages

# Looked up once: a patch builds up to six arrays and two images per table.
_INT64, _UINT8, _UINT64 = np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.uint64)
_bucket_images = field_builder(BucketImages)
_word_images = field_builder(WordImages)

__all__ = ["DESCRIPTOR_ROWS", "apply_images", "take_dirty"]

# Rows of the write descriptor read here (kernel.write_descriptor's order; a unit test
# holds them to it).
cdef enum:
    _SEEDS = 5
    _BUCKET_DIRTY = 6
    _DIRTY_BUCKETS = 7
    _STATE = 9
    _WORDS = 10
    _WORD_DIRTY = 15
    _DIRTY_WORDS = 16
    _OTHELLO_STATE = 18
    _N_DIRTY = 1  # state slot: how many entries the dirty list holds

#: name -> row of the descriptor entries used here.
DESCRIPTOR_ROWS = {
    "table.seeds": _SEEDS,
    "table.bucket_dirty": _BUCKET_DIRTY,
    "table.dirty_buckets": _DIRTY_BUCKETS,
    "table.state": _STATE,
    "othello.words": _WORDS,
    "othello.word_dirty": _WORD_DIRTY,
    "othello.dirty_words": _DIRTY_WORDS,
    "othello.state": _OTHELLO_STATE,
}


cdef inline char* _at(const uint64_t* desc, int row) noexcept:
    return <char*><uintptr_t>desc[2 * row]


cdef inline Py_ssize_t _size(const uint64_t* desc, int row) noexcept:
    return <Py_ssize_t>desc[2 * row + 1]


cdef object _new(Py_ssize_t nbytes, char** data):
    """A bytearray of ``nbytes`` to fill through ``data`` (its memory, malloc-aligned)."""
    buffer = PyByteArray_FromStringAndSize(NULL, nbytes)
    data[0] = PyByteArray_AS_STRING(buffer)
    return buffer


def take_dirty(
    uintptr_t descriptor,
    uintptr_t cells,
    Py_ssize_t cell_size,
    object cell_dtype,
    uintptr_t fps,
    Py_ssize_t fp_size,
    object fp_dtype,
    bint words,
):
    """Take a table's dirty buckets and words, clearing their marks.

    ``descriptor``, ``cells`` and ``fps``: the addresses of the table's write descriptor
    (a uint64 array), its cells and fingerprints (``fp_size`` 0: none in the view); the
    caller keeps them alive and in place during the call. ``cell_size`` and
    ``fp_size`` their item sizes, ``cell_dtype`` and ``fp_dtype`` their dtypes.
    ``words`` False: the dirty words are dropped (an Othello reset carries them all).

    Returns ``(buckets, words)``: the :class:`BucketImages` of the dirty buckets, in the
    order they were first written (fingerprints None without them in the view), and the
    :class:`WordImages` of the dirty words in the same order; None for either when
    nothing of it is dirty (or the words are dropped).
    """
    cdef const uint64_t* desc = <const uint64_t*>descriptor
    cdef int64_t* state = <int64_t*>_at(desc, _STATE)
    cdef int64_t* dirty = <int64_t*>_at(desc, _DIRTY_BUCKETS)
    cdef uint8_t* marks = <uint8_t*>_at(desc, _BUCKET_DIRTY)
    cdef uint8_t* seeds = <uint8_t*>_at(desc, _SEEDS)
    cdef Py_ssize_t nb = _size(desc, _SEEDS)
    cdef Py_ssize_t n = state[_N_DIRTY]
    cdef Py_ssize_t k, b, row = 4 * cell_size, fp_row = 4 * fp_size
    cdef char* out_buckets
    cdef char* out_seeds
    cdef char* out_cells
    cdef char* out_fps = NULL
    cdef int64_t* ostate = <int64_t*>_at(desc, _OTHELLO_STATE)
    cdef int64_t* dirty_words = <int64_t*>_at(desc, _DIRTY_WORDS)
    cdef uint8_t* word_marks = <uint8_t*>_at(desc, _WORD_DIRTY)
    cdef uint64_t* all_words = <uint64_t*>_at(desc, _WORDS)
    cdef Py_ssize_t n_words = _size(desc, _WORDS)
    cdef Py_ssize_t m = ostate[_N_DIRTY]
    cdef char* out_indices
    cdef char* out_values
    if not (0 <= n <= nb and 0 <= m <= n_words):
        raise ValueError(f"dirty lists of {n} buckets and {m} words: the table is corrupt")
    _check_indices(dirty, n, nb, "dirty bucket", ValueError)
    _check_indices(dirty_words, m, n_words, "dirty word", ValueError)
    bucket_images = word_images = None
    if n:
        buckets_buffer = _new(8 * n, &out_buckets)
        seeds_buffer = _new(n, &out_seeds)
        cells_buffer = _new(row * n, &out_cells)
        memcpy(out_buckets, dirty, 8 * n)
        for k in range(n):
            b = dirty[k]
            marks[b] = 0
            out_seeds[k] = seeds[b]
            memcpy(out_cells + k * row, <char*>cells + b * row, row)
        fingerprints = None
        if fp_size:
            fps_buffer = _new(fp_row * n, &out_fps)
            for k in range(n):
                memcpy(out_fps + k * fp_row, <char*>fps + dirty[k] * fp_row, fp_row)
            fingerprints = array_over(fps_buffer, out_fps, fp_dtype, n, 4)
        state[_N_DIRTY] = 0
        bucket_images = _bucket_images(
            array_over(buckets_buffer, out_buckets, _INT64, n, 0),
            array_over(seeds_buffer, out_seeds, _UINT8, n, 0),
            array_over(cells_buffer, out_cells, cell_dtype, n, 4),
            fingerprints,
        )
    if m:
        for k in range(m):
            word_marks[dirty_words[k]] = 0
        ostate[_N_DIRTY] = 0
        if words:
            indices_buffer = _new(8 * m, &out_indices)
            values_buffer = _new(8 * m, &out_values)
            memcpy(out_indices, dirty_words, 8 * m)
            for k in range(m):
                (<uint64_t*>out_values)[k] = all_words[dirty_words[k]]
            word_images = _word_images(
                array_over(indices_buffer, out_indices, _INT64, m, 0),
                array_over(values_buffer, out_values, _UINT64, m, 0),
            )
    return bucket_images, word_images


cdef int _check_indices(
    const int64_t* values, Py_ssize_t n, Py_ssize_t limit, str what, object error
) except -1:
    """Raise ``error`` naming the first of ``values`` outside 0..limit-1."""
    cdef Py_ssize_t k
    for k in range(n):
        if not 0 <= values[k] < limit:
            raise error(f"{what} {values[k]} is outside 0..{limit - 1}")
    return 0


cdef bint _is(Py_buffer* view, const char* fmt, Py_ssize_t itemsize) noexcept:
    """The buffer holds items of exactly this native format and size."""
    return view.itemsize == itemsize and view.format != NULL and strcmp(view.format, fmt) == 0


def apply_images(tuple target, object images, object words):
    """Write a patch's bucket and word images (:class:`~kvcompass.index.patches.BucketImages`,
    :class:`~kvcompass.index.patches.WordImages`, None: none) into a view. Returns False,
    having written nothing, when their arrays are not the layout handled here: the caller
    writes them with numpy then.

    ``target``: the view's ``(seeds, cells, words, fingerprints)`` addresses (0: no
    fingerprints), then its cell and fingerprint item sizes, bucket and word counts.
    Handled: C-contiguous int64 bucket and word indices, uint8 seeds, unsigned cells and
    fingerprints of the view's own item sizes, uint64 word values. Every index is
    checked before anything is written (IndexError).
    """
    cdef uintptr_t to_seeds, to_cells, to_words, to_fps
    cdef Py_ssize_t cell_size, fp_size, nb, n_words
    to_seeds, to_cells, to_words, to_fps, cell_size, fp_size, nb, n_words = target
    cdef Py_buffer views[6]
    cdef bint held[6]
    cdef Py_ssize_t n = 0, m = 0, k, b, row = 4 * cell_size, fp_row = 4 * fp_size
    cdef const int64_t* bucket_ids = NULL
    cdef const int64_t* word_ids = NULL
    buckets = seeds = cells = fingerprints = word_indices = word_values = None
    if images is not None:
        buckets, seeds, cells = images.buckets, images.seeds, images.cells
        fingerprints = images.fingerprints
    if words is not None:
        word_indices, word_values = words.indices, words.values
    cdef bint with_fps = fingerprints is not None and to_fps != 0
    arrays = (buckets, seeds, cells, fingerprints, word_indices, word_values)
    for k in range(6):
        held[k] = False
    try:
        for k in range(6):
            array = arrays[k]
            if array is not None:
                try:
                    get_buffer(array, &views[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                except (BufferError, TypeError, ValueError):
                    return False  # not one contiguous buffer: numpy scatters it
                held[k] = True
        if buckets is not None:
            n = views[0].len // 8
            if not (
                _is(&views[0], b"l", 8) or _is(&views[0], b"q", 8)
            ) or seeds is None or cells is None:
                return False
            if not (
                (_is(&views[1], b"B", 1))
                and views[1].len == n
                and views[2].itemsize == cell_size
                and views[2].len == n * row
                and views[2].format != NULL
                and views[2].format[0] in b"ILQ"
            ):
                return False
            if with_fps and not (
                views[3].itemsize == fp_size
                and views[3].len == n * fp_row
                and views[3].format != NULL
                and views[3].format[0] in b"BH"
            ):
                return False
            bucket_ids = <const int64_t*>views[0].buf
            _check_indices(bucket_ids, n, nb, "bucket", IndexError)
        if word_indices is not None:
            m = views[4].len // 8
            if not (
                (_is(&views[4], b"l", 8) or _is(&views[4], b"q", 8))
                and word_values is not None
                and (_is(&views[5], b"L", 8) or _is(&views[5], b"Q", 8))
                and views[5].len == 8 * m
            ):
                return False
            word_ids = <const int64_t*>views[4].buf
            _check_indices(word_ids, m, n_words, "word", IndexError)
        for k in range(m):
            (<uint64_t*>to_words)[word_ids[k]] = (<const uint64_t*>views[5].buf)[k]
        for k in range(n):
            b = bucket_ids[k]
            (<uint8_t*>to_seeds)[b] = (<const uint8_t*>views[1].buf)[k]
            memcpy(<char*>to_cells + b * row, <const char*>views[2].buf + k * row, row)
            if with_fps:
                memcpy(<char*>to_fps + b * fp_row, <const char*>views[3].buf + k * fp_row, fp_row)
        return True
    finally:
        for k in range(6):
            if held[k]:
                PyBuffer_Release(&views[k])
