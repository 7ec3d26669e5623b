"""The emulated GPU worker's core: a two-tier prefix cache by blocks, the cost model and
a discrete-event engine (no I/O; the service and the simulator drive it with a clock)."""

from kvcompass.worker.cache import CacheMatch, EvictionPolicy, OnChange, PrefixCache, PrefixChange
from kvcompass.worker.cost import CostModel
from kvcompass.worker.engine import (
    Emitted,
    EmulatedEngine,
    MigrationMode,
    Request,
    Sequence,
    Timings,
)

__all__ = [
    "CacheMatch",
    "CostModel",
    "Emitted",
    "EmulatedEngine",
    "EvictionPolicy",
    "MigrationMode",
    "OnChange",
    "PrefixCache",
    "PrefixChange",
    "Request",
    "Sequence",
    "Timings",
]
