"""Everything one simulation run depends on besides its requests."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kvcompass.routing import RoutingConfig
from kvcompass.topology import Topology
from kvcompass.worker import EvictionPolicy

__all__ = ["SimConfig"]


@dataclass(frozen=True)
class SimConfig:
    """A run: topology, policy, routing knobs, seed, cache and index-pipeline faults.

    ``update_delay_ms`` / ``update_loss`` act on patch batches between the maintenance
    units and each edge region (every region draws its own losses). ``resync``: the
    edge's follower detects a gap or a newer epoch and reloads the shard from a writer
    snapshot, and every ``snapshot_every_s`` compares itself against the shard's
    snapshot (anti-entropy, which also recovers a lost final batch); off, an edge applies
    whatever reaches it, like the paper's edges. ``jitter_pct``: every WAN crossing
    takes its one-way delay times a uniform factor in [1 − p/100, 1 + p/100].
    ``time_limit_s``: stop admitting arrivals after this simulated time (None: all);
    requests admitted still finish. ``serving_overhead_ms``: a fixed time every request
    pays between its routing decision and its worker, for what the live path does and
    the paper's model has not (HTTP parse and forward at the router, the worker's HTTP
    and SSE handling); 0, the paper's model, by default (``kvcompass sim agree``
    measures the live value).
    """

    topology: Topology
    policy: str = "kvcompass"
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    seed: int = 0
    eviction: EvictionPolicy = EvictionPolicy.LRU
    update_delay_ms: float = 0.0
    update_loss: float = 0.0
    resync: bool = True
    jitter_pct: float = 0.0
    sample_every_s: float = 1.0
    time_limit_s: float | None = None
    serving_overhead_ms: float = 0.0
    #: Index shards (one maintenance unit's writer each).
    shards: int = 4
    #: The MU's patch flush period under load (the live default of ``KVC_FLUSH_MS``).
    flush_ms: float = 5.0
    #: Anti-entropy period with ``resync`` (the live MU's snapshot cadence is 30 s; a
    #: simulation of a few minutes needs a shorter one to show recovery at all).
    snapshot_every_s: float = 5.0
    #: A region's queue vector to its own edges every this often (live default 20 ms).
    local_period_s: float = 0.02

    def __post_init__(self) -> None:
        if not 0 <= self.update_loss <= 1:
            raise ValueError(f"update_loss must be in [0, 1], got {self.update_loss}")
        for name in ("update_delay_ms", "serving_overhead_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.jitter_pct < 100:
            raise ValueError(f"jitter_pct must be in [0, 100), got {self.jitter_pct}")
        positive = ("sample_every_s", "flush_ms", "snapshot_every_s", "local_period_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.shards < 1:
            raise ValueError(f"shards must be at least 1, got {self.shards}")
        # Infinity passes the ranges above: an infinite serving overhead hung the event
        # loop (every request due at t = inf), an infinite flush never wrote the index.
        finite = ("update_delay_ms", "serving_overhead_ms", *positive)
        for name in finite:
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: the topology by name, the routing knobs as nested dicts."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["topology"] = self.topology.name
        out["routing"] = dataclasses.asdict(self.routing)
        out["eviction"] = str(self.eviction)
        return out
