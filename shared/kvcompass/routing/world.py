"""Exact state of the whole pool, which only a simulator can give a policy.

The Oracle baseline (least-loaded worker of the pool) and the central directory (exact
global state) are defined by knowing what no edge can know live: every worker's queue
at this instant. The simulator passes its pool as a :class:`WorldView`; without one
(the live router), those policies fall back to the edge's queue estimates and say so.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["WorldView"]


class WorldView(Protocol):
    def queue_ms(self, worker: int) -> float:
        """Prefill work (ms) queued now at worker ``worker`` (global index)."""
        ...
