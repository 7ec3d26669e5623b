"""Worker side: turn "this prefix is now in VRAM / DRAM / gone" into KV event batches.

A worker registers a cached prefix at every length any edge may query toward its region
(:mod:`kvcompass.levels`). The keys of one change are grouped by shard and each group is
sent as one batch to that shard's partition, explicitly (client partitioners disagree,
so the key hash never decides the partition). Every batch takes the worker's next
sequence number, which maintenance units use to drop redeliveries.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, TokenIds, prefix_keys, shard_of
from kvcompass.levels import LevelPlan
from kvcompass.topology import Worker
from kvcompass.wire import EventKind, KVEvent, KVEventBatch, encode

__all__ = ["EventPublisher", "Send"]

#: Delivers one encoded batch to a shard's partition of ``kvc.events``.
Send = Callable[[int, bytes], None]


class EventPublisher:
    """Builds and sends one worker's KV event batches.

    ``first_seq`` defaults to the current time in microseconds, so a restarted worker
    continues above every sequence number it used before (clocks permitting) instead
    of having its new batches dropped as duplicates.
    """

    def __init__(
        self,
        worker: Worker,
        plan: LevelPlan,
        namespace: Namespace,
        n_shards: int,
        send: Send,
        first_seq: int | None = None,
    ) -> None:
        self.worker = worker
        self.namespace = namespace
        self.n_shards = n_shards
        self._lengths = plan.registration_lengths[worker.region]
        self._send = send
        self.next_seq = time.time_ns() // 1000 if first_seq is None else first_seq

    def admit(self, tokens: TokenIds, tier: Tier = Tier.VRAM) -> list[KVEventBatch]:
        return self.publish(EventKind.ADMIT, tokens, tier)

    def move(self, tokens: TokenIds, tier: Tier) -> list[KVEventBatch]:
        return self.publish(EventKind.TIER, tokens, tier)

    def evict(self, tokens: TokenIds) -> list[KVEventBatch]:
        return self.publish(EventKind.EVICT, tokens, Tier.ABSENT)

    def publish(self, kind: EventKind, tokens: TokenIds, tier: Tier) -> list[KVEventBatch]:
        """Send the change of one cached prefix; returns the batches sent (one per shard)."""
        keys = prefix_keys(tokens, self._lengths, self.namespace)
        by_shard: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for length, key in keys.items():
            by_shard[shard_of(key, self.n_shards)].append((length, key))
        sent = []
        now = time.time_ns()
        for shard, pairs in sorted(by_shard.items()):
            batch = KVEventBatch(
                worker_id=self.worker.id,
                region=self.worker.region,
                worker_seq=self.next_seq,
                shard=shard,
                sent_at_ns=now,
                events=(KVEvent(kind, tier, tuple(pairs)),),
            )
            self.next_seq += 1
            self._send(shard, encode(batch))
            sent.append(batch)
        return sent
