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
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcompass.topology import Topology, Worker

__all__ = ["CostModel"]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Durations in milliseconds of one worker's operations."""

    beta_ms_per_token: float
    gamma_ms_per_token: float
    decode_ms_per_step: float
    decode_ms_per_step_per_seq: float
    intra_region_one_way_ms: float

    @classmethod
    def for_worker(cls, topology: Topology, worker: Worker) -> CostModel:
        return cls(
            beta_ms_per_token=worker.beta_ms_per_token,
            gamma_ms_per_token=topology.gamma_ms_per_token,
            decode_ms_per_step=topology.model.decode_ms_per_step,
            decode_ms_per_step_per_seq=topology.model.decode_ms_per_step_per_seq,
            intra_region_one_way_ms=topology.intra_region_one_way_ms,
        )

    def prefill_ms(self, prompt_tokens: int, reused_tokens: int) -> float:
        """Computing the prompt's KV beyond the reused prefix: β·(L − reused)."""
        return self.beta_ms_per_token * max(prompt_tokens - reused_tokens, 0)

    def reload_ms(self, dram_tokens: int) -> float:
        """Bringing a reused prefix's DRAM part into VRAM: γ·tokens."""
        return self.gamma_ms_per_token * dram_tokens

    def decode_step_ms(self, batch: int) -> float:
        """One decode step that emits a token for each of ``batch`` (≥ 1) sequences."""
        return self.decode_ms_per_step + self.decode_ms_per_step_per_seq * max(batch - 1, 0)

    def copy_ms(self, tokens: int) -> float:
        """Copying a prefix's KV from a peer of the region into this worker's DRAM."""
        return self.intra_region_one_way_ms + self.gamma_ms_per_token * tokens
