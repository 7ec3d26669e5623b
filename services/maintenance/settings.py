"""Settings of a maintenance unit (``KVC_*`` environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcompass.services.settings import PipelineSettings
from kvcompass.settings import setting

__all__ = ["MaintenanceSettings"]


@dataclass(frozen=True, kw_only=True)
class MaintenanceSettings(PipelineSettings):
    """Consumer group, flush window, snapshot cadence and the topology served."""

    group_id: str = setting("kvc-mu", "Consumer group of all maintenance units.")
    flush_ms: float = setting(
        5.0,
        "Patch flush window under load: while reads come back full, publish patches this "
        "often (ms); after a short read each shard publishes as soon as its part of the "
        "read is applied. Also the longest wait for the next event when idle.",
    )
    flush_keys: int = setting(20_000, "Flush earlier once this many keys were applied.")
    snapshot_interval_s: float = setting(
        30.0, "Snapshot every owned shard to Redis at least this often (seconds)."
    )
    initial_capacity: int = setting(65_536, "Keys a new table holds before it first grows.")
    session_timeout_ms: int = setting(6000, "Consumer-group session timeout (ms).")
    max_seq_jump: int = setting(
        1_000_000,
        "Largest step of one worker's sequence number between two of its batches in a "
        "shard; a batch beyond it is dead-lettered with the reason instead of applied.",
    )

    def validate(self) -> None:
        super().validate()
        if self.flush_ms <= 0:
            raise self.invalid("flush_ms", "must be positive")
        if self.flush_keys < 1:
            raise self.invalid("flush_keys", "must be at least 1")
        if self.snapshot_interval_s <= 0:
            raise self.invalid("snapshot_interval_s", "must be positive")
        if self.initial_capacity < 8:
            raise self.invalid("initial_capacity", "must be at least 8")
        if self.drain_timeout_s <= 0:
            raise self.invalid("drain_timeout_s", "must be positive")
        if self.max_seq_jump < 1:
            raise self.invalid("max_seq_jump", "must be at least 1")
