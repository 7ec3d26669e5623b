"""Settings of an edge replayer (``KVC_*`` environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcompass.services.settings import PipelineSettings
from kvcompass.settings import setting

__all__ = ["EdgeSettings"]


@dataclass(frozen=True, kw_only=True)
class EdgeSettings(PipelineSettings):
    """Where the views live, how the patch stream is replayed, when to give up."""

    shm_prefix: str = setting("kvc-edge", "Name prefix of the shared-memory segments.")
    bootstrap_retry_s: float = setting(
        0.2,
        "Seconds between attempts to load a shard that has no usable snapshot yet; also "
        "the first wait before retrying an unreachable Redis.",
    )
    redis_retry_max_s: float = setting(
        5.0, "Longest wait between attempts to reach Redis (the wait doubles per failure)."
    )
    snapshot_check_s: float = setting(
        2.0,
        "When no batch was applied for this long, compare each shard with its Redis "
        "snapshot and reload shards that fell behind (a lost final batch has no successor "
        "to reveal the gap) or whose snapshot has another writer now.",
    )

    def validate(self) -> None:
        super().validate()
        for name in ("bootstrap_retry_s", "redis_retry_max_s", "snapshot_check_s"):
            if getattr(self, name) <= 0:
                raise self.invalid(name, "must be positive")
