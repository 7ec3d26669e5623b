"""What a completion is to the emulated engine: the request, where its time went, and
how a migrated prefix arrives. Plain values; the engine that fills them in
(:mod:`kvcompass.worker.engine`) is compiled."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvcompass.frozen_init import frozen_init
from kvcompass.keys import Namespace, TokenIds

__all__ = ["MigrationMode", "Request", "Timings"]


@frozen_init
@dataclass(frozen=True, slots=True)
class Request:
    """A completion to compute: ``max_tokens`` (≥ 1) output tokens after the prompt
    (``tokens``: best a uint32 buffer, which the cache reads as it is)."""

    request_id: str
    namespace: Namespace
    tokens: TokenIds
    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@frozen_init
@dataclass(frozen=True, slots=True)
class Timings:
    """Where a completion's time went, in emulated milliseconds."""

    queue: float
    reload: float
    prefill: float
    decode: float
    ttft: float


class MigrationMode(StrEnum):
    RECOMPUTE = "recompute"  # prefill the shipped prompt here (costs this worker's queue)
    COPY = "copy"  # copy the KV from a peer of the region
