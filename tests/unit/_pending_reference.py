"""REFERENCE ORACLE FOR TESTS ONLY: ``kvcompass.routing.pending`` as it was in Python,
before it was compiled (frozen; tests/unit/test_routing_pending.py holds the compiled
one to it).

Prefixes an edge has just sent to a worker, credited before the index knows them.

A worker holds a prompt's blocks once its prefill starts, and the index learns of them a
flush and a patch later. Until then a second request with the same prefix sees no
holder, goes wherever the score says and recomputes it. On an idle pool that window is
milliseconds; in overload it is the whole queue wait, seconds in which every request of
a new prefix family lands on a different worker. So the edge remembers where it sent
each prefix (its keys at that region's lengths) until the worker has surely started it:
the queue estimate it routed on plus a slack for the index's lag and the estimate's
error. A request whose keys were sent there is credited that length, in VRAM, as if the
index said so (the index's own longer match wins). Peers do the same: llm-d's
speculative entries with a TTL, Dynamo's predicted active blocks.

The policy records only what it sends to its own region, where its queue estimates are
live: a remote worker's estimate is a report old, and a credit there draws more of a hot
family into a queue the edge cannot see grow (on sim-16region WildChat at 3 λ0 that
doubled the hottest worker's load and raised P99 TTFT by a third). Each edge remembers
only its own decisions; a claim the worker did not keep (the request went to a fallback,
or its blocks were evicted first) costs that worker belief, as any false claim.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from kvcompass.index.layout import Tier

__all__ = ["PendingPrefixes"]

_VRAM = int(Tier.VRAM)


class PendingPrefixes:
    """Key → (worker, until) for this edge's recent sends to its own region; see the
    module docstring. At most ``capacity`` keys are remembered (the oldest go first).

    Both methods take the prompt's (length, key) pairs at the edge's own region's
    lengths: the keys a send records are the keys a later request is credited by.
    """

    def __init__(self, slack_s: float, capacity: int = 65_536) -> None:
        if slack_s < 0 or capacity < 1:
            raise ValueError("slack_s must be >= 0 and capacity >= 1")
        self.slack_s = slack_s
        self.capacity = capacity
        self._sent: dict[int, tuple[int, float]] = {}
        # (until, keys) per send, as recorded, and how many keys they hold in all.
        self._order: deque[tuple[float, list[int]]] = deque()
        self._recorded = 0

    def __len__(self) -> int:
        return len(self._sent)

    def record(
        self, worker: int, pairs: Sequence[tuple[int, int]], now: float, wait_s: float
    ) -> None:
        """``worker`` will hold the prefixes ``pairs`` once the ``wait_s`` ahead of them
        has passed (infinite: the worker is believed down and nothing is recorded)."""
        if not math.isfinite(wait_s):
            return
        until = now + wait_s + self.slack_s
        keys = [key for _, key in pairs]
        self._sent.update(dict.fromkeys(keys, (worker, until)))
        self._order.append((until, keys))
        self._recorded += len(keys)
        self._prune(now)

    def credit(
        self,
        pairs: Sequence[tuple[int, int]],
        lengths: Sequence[int],
        tiers: Sequence[int],
        now: float,
    ) -> tuple[Sequence[int], Sequence[int]]:
        """The index's ``lengths`` and ``tiers`` with the pending prefixes among
        ``pairs`` added where they are longer (new lists then; the same ones otherwise)."""
        sent = self._sent
        if not sent:
            return lengths, tiers
        longer: dict[int, int] = {}
        for length, key in pairs:
            entry = sent.get(key)
            if entry is not None:
                worker, until = entry
                if until >= now and length > lengths[worker]:
                    longer[worker] = length  # pairs ascend: a longer one comes later
        if not longer:
            return lengths, tiers
        lengths, tiers = list(lengths), list(tiers)
        for worker, length in longer.items():
            lengths[worker] = length
            tiers[worker] = _VRAM
        return lengths, tiers

    def _prune(self, now: float) -> None:
        """Forget the lapsed sends at the front, then the oldest keys beyond capacity (a
        send's first keys first: a longer prefix outlives its shorter ones)."""
        sent, order = self._sent, self._order
        while order:
            until, keys = order[0]
            if until < now:
                drop = len(keys)
            elif self._recorded > self.capacity:
                drop = min(len(keys), self._recorded - self.capacity)
            else:
                return
            for key in keys[:drop]:
                entry = sent.get(key)
                if entry is not None and entry[1] == until:  # not since sent again
                    del sent[key]
            self._recorded -= drop
            if drop == len(keys):
                order.popleft()
            else:
                del keys[:drop]
