# The compiled cost model's C interface, for the engine (engine.pyx) to call directly.

cdef class CostModel:
    cdef readonly double beta_ms_per_token
    cdef readonly double gamma_ms_per_token
    cdef readonly double decode_ms_per_step
    cdef readonly double decode_ms_per_step_per_seq
    cdef readonly double intra_region_one_way_ms

    cpdef double prefill_ms(self, Py_ssize_t prompt_tokens, Py_ssize_t reused_tokens)
    cpdef double reload_ms(self, Py_ssize_t dram_tokens)
    cpdef double decode_step_ms(self, Py_ssize_t batch)
    cpdef double copy_ms(self, Py_ssize_t tokens)
    cdef tuple _fields(self)
