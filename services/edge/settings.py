"""Settings of an edge replayer (``KVC_*`` environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcompass.settings import PipelineSettings, setting

__all__ = ["EdgeSettings"]


@dataclass(frozen=True, kw_only=True)
class EdgeSettings(PipelineSettings):
    """Where the views live and how the patch stream is replayed."""

    shm_prefix: str = setting("kvc-edge", "Name prefix of the shared-memory segments.")
    bootstrap_retry_s: float = setting(
        0.2, "Seconds between attempts to load a shard that has no snapshot yet."
    )
    snapshot_check_s: float = setting(
        2.0,
        "When the stream is idle this long, compare each shard with its Redis snapshot "
        "and reload shards that fell behind (a lost final batch has no successor to "
        "reveal the gap).",
    )
    fault_drop: float = setting(0.0, "Fault injection: probability to drop a patch batch.")
    fault_duplicate: float = setting(
        0.0, "Fault injection: probability to apply a patch batch twice."
    )
    fault_reorder: float = setting(
        0.0, "Fault injection: probability to swap a patch batch with the next one."
    )
    fault_seed: int = setting(0, "Seed of the fault-injection random stream.")

    def validate(self) -> None:
        super().validate()
        for name in ("fault_drop", "fault_duplicate", "fault_reorder"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise self.invalid(name, "must be a probability in [0, 1)")
        if self.snapshot_check_s <= 0:
            raise self.invalid("snapshot_check_s", "must be positive")
        if self.bootstrap_retry_s <= 0:
            raise self.invalid("bootstrap_retry_s", "must be positive")
