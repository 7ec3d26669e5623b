"""Hot-prefix migration (paper §3.4 "Insert"): replicate a prefix that turned hot locally.

Serving spreads a prefix only where it is served, so a prefix that turns hot in a region
that never served it keeps crossing the WAN or recomputing. The edge counts local misses
per prefix family (every prompt sharing the first chunk, i.e. the key at the edge's first
own-region length); H misses within T_h make the family hot. Then it orders a replica of
the triggering request's prefix into the DRAM of a persistently idle worker of its own
region when

- the region has no local holder and a remote holder matches at least that holder
  region's n1 (the first length worth a WAN trip): ship the prompt, recompute there
  (KV tensors are too big for the WAN); or
- local holders exist but every one keeps losing the joint score to load: copy from the
  best local holder (worker to worker inside the region).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["HotPrefixTracker", "MigrationOrder", "MigrationPlanner"]


@dataclass(frozen=True, slots=True)
class MigrationOrder:
    """Load the first ``prefix_tokens`` tokens of the request's prompt into
    ``target_worker``'s DRAM: by copy from ``source_worker`` (same region) or by
    recomputing (``source_worker`` None: the edge ships the prompt)."""

    prefix_tokens: int
    target_worker: int
    source_worker: int | None
    mode: Literal["copy", "recompute"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix_tokens": self.prefix_tokens,
            "target_worker": self.target_worker,
            "source_worker": self.source_worker,
            "mode": self.mode,
        }


class HotPrefixTracker:
    """Sliding-window miss counts per prefix family, bounded to ``max_families``."""

    def __init__(self, hot_misses: int, window_s: float, max_families: int) -> None:
        self.hot_misses = hot_misses
        self.window_s = window_s
        self.max_families = max_families
        self._misses: OrderedDict[int, deque[float]] = OrderedDict()

    def miss(self, family: int, now: float) -> bool:
        """Count a local miss at ``now``; True when the family is hot (≥ H in the window).

        Only the last H miss times matter, so each family keeps at most H.
        """
        times = self._misses.get(family)
        if times is None:
            times = self._misses[family] = deque(maxlen=self.hot_misses)
            if len(self._misses) > self.max_families:
                self._misses.popitem(last=False)  # the family missed least recently
        else:
            self._misses.move_to_end(family)
        times.append(now)
        return len(times) == self.hot_misses and times[0] > now - self.window_s

    def reset(self, family: int) -> None:
        """A migration was ordered: the family must turn hot again to order another."""
        self._misses.pop(family, None)

    def __len__(self) -> int:
        return len(self._misses)


class MigrationPlanner:
    """Chooses what to migrate and where, once a family is hot (see the module docstring).

    ``local`` are the edge region's workers; ``n1[w]`` the first length worth forwarding
    from this edge to worker ``w``'s region; ``block_size`` aligns shipped prompts.
    """

    def __init__(
        self, local: Sequence[int], n1: Sequence[int], block_size: int, idle_for_s: float
    ) -> None:
        self.local = tuple(local)
        self._local_set = frozenset(local)
        self.n1 = tuple(n1)
        self.block_size = block_size
        self.idle_for_s = idle_for_s

    def plan(
        self,
        prompt_tokens: int,
        lengths: Sequence[int],
        idle_for: Callable[[int], float],
        lost_to_load: Callable[[int], bool],
    ) -> MigrationOrder | None:
        """An order for a hot family's triggering request, or None (no trigger or no target).

        ``lengths[w]``: worker ``w``'s match (0: none); ``idle_for(w)``: how long its
        queue estimate has been 0 (asked only of local workers, once a trigger holds);
        ``lost_to_load(w)``: the local holder ``w`` lost this request's score only by its
        queue (the caller counts only requests no local holder won).
        """
        local_holders = [w for w in self.local if lengths[w]]
        if local_holders:
            if not all(lost_to_load(w) for w in local_holders):
                return None  # a holder lost on merit (slower, shorter match): no copy helps
            holder = max(local_holders, key=lambda w: (lengths[w], -w))
            source: int | None = holder
            prefix = lengths[holder]
            mode: Literal["copy", "recompute"] = "copy"
        else:
            remote = any(
                m >= self.n1[w] for w, m in enumerate(lengths) if m and w not in self._local_set
            )
            if not remote:
                return None
            source = None
            prefix = prompt_tokens - prompt_tokens % self.block_size
            mode = "recompute"
        if prefix <= 0:
            return None
        idle = {w: idle_for(w) for w in self.local if lengths[w] < prefix}
        ready = [w for w, s in idle.items() if s >= self.idle_for_s]
        if not ready:
            return None
        target = max(ready, key=lambda w: (idle[w], -w))  # idle longest, then lowest index
        return MigrationOrder(prefix, target, source, mode)
