# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""How long an emulated GPU worker takes: prefill, DRAM reload, decode, peer copy.

Every constant comes from the topology file, where each one carries its source:

- β, prefill ms per uncached prompt token: the worker's ``beta_ms_per_token``
  (testbed-3region: 0.085, the paper's calibrated RTX 5090 rate for Llama-3.1-8B, §5.2).
- γ, ms per token to bring KV from host DRAM into VRAM: ``cost.gamma_ms_per_token``
  (derived: KV bytes per token ÷ effective PCIe bandwidth; see the topology file).
- decode step: ``model.decode_ms_per_step`` for a batch of one, plus
  ``model.decode_ms_per_step_per_seq`` per further sequence (derived from memory
  bandwidth: a step streams the weights once and each sequence's KV; see ModelSettings).
- a copy from a peer in the region: one intra-region hop
  (``cost.intra_region_one_way_ms``) plus γ per token. Our assumption: a region's
  workers share a server (the paper's testbed), so the copy crosses PCIe once, out of
  the peer's GPU into host memory, which is the target's DRAM tier.

Compiled (Cython) for the engine, which asks it for every prefill, reload and decode
step it schedules; ``cost.pxd`` declares it for the engine, ``cost.pyi`` for Python.
"""

__all__ = ["CostModel"]


cdef class CostModel:
    """Durations in milliseconds of one worker's operations (immutable)."""

    def __init__(
        self,
        double beta_ms_per_token,
        double gamma_ms_per_token,
        double decode_ms_per_step,
        double decode_ms_per_step_per_seq,
        double intra_region_one_way_ms,
    ):
        self.beta_ms_per_token = beta_ms_per_token
        self.gamma_ms_per_token = gamma_ms_per_token
        self.decode_ms_per_step = decode_ms_per_step
        self.decode_ms_per_step_per_seq = decode_ms_per_step_per_seq
        self.intra_region_one_way_ms = intra_region_one_way_ms

    @classmethod
    def for_worker(cls, topology, worker):
        return cls(
            beta_ms_per_token=worker.beta_ms_per_token,
            gamma_ms_per_token=topology.gamma_ms_per_token,
            decode_ms_per_step=topology.model.decode_ms_per_step,
            decode_ms_per_step_per_seq=topology.model.decode_ms_per_step_per_seq,
            intra_region_one_way_ms=topology.intra_region_one_way_ms,
        )

    cpdef double prefill_ms(self, Py_ssize_t prompt_tokens, Py_ssize_t reused_tokens):
        """Computing the prompt's KV beyond the reused prefix: β·(L − reused)."""
        cdef Py_ssize_t computed = prompt_tokens - reused_tokens
        return self.beta_ms_per_token * <double>(computed if computed > 0 else 0)

    cpdef double reload_ms(self, Py_ssize_t dram_tokens):
        """Bringing a reused prefix's DRAM part into VRAM: γ·tokens."""
        return self.gamma_ms_per_token * <double>dram_tokens

    cpdef double decode_step_ms(self, Py_ssize_t batch):
        """One decode step that emits a token for each of ``batch`` (≥ 1) sequences."""
        cdef Py_ssize_t more = batch - 1
        return self.decode_ms_per_step + self.decode_ms_per_step_per_seq * <double>(
            more if more > 0 else 0
        )

    cpdef double copy_ms(self, Py_ssize_t tokens):
        """Copying a prefix's KV from a peer of the region into this worker's DRAM."""
        return self.intra_region_one_way_ms + self.gamma_ms_per_token * <double>tokens

    cdef tuple _fields(self):
        return (
            self.beta_ms_per_token,
            self.gamma_ms_per_token,
            self.decode_ms_per_step,
            self.decode_ms_per_step_per_seq,
            self.intra_region_one_way_ms,
        )

    def __eq__(self, other):
        if not isinstance(other, CostModel):
            return NotImplemented
        return self._fields() == (<CostModel>other)._fields()

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        names = (
            "beta_ms_per_token",
            "gamma_ms_per_token",
            "decode_ms_per_step",
            "decode_ms_per_step_per_seq",
            "intra_region_one_way_ms",
        )
        terms = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True))
        return f"CostModel({terms})"
