"""Worker side: turn "this prefix is now in VRAM / DRAM / gone" into KV event batches.

A worker registers a cached prefix at every length any edge may query toward its region
(:mod:`kvcompass.levels`). The keys of one change are grouped by shard and each group is
sent as one batch to that shard's partition, explicitly (client partitioners disagree,
so the key hash never decides the partition). Every batch takes the worker's next
sequence number, which maintenance units use to drop redeliveries.

A publisher is one *incarnation* of its worker: a random number picked at start, sent
with every batch, with sequence numbers from 0. A restarted worker is a new incarnation,
so its numbering starts over without relying on a clock that may step back, and a
maintenance unit that meets a new incarnation drops everything the worker's earlier runs
cached in that shard: a restarted engine's cache is empty. :meth:`EventPublisher.announce`
tells every shard at start, not at the worker's first change there.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Collection, Sequence
from typing import Final

from kvcompass.event_buffers import ShardEventBuffers
from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, PrefixHasher, TokenIds, token_array
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock, SystemClock, stamp_ns
from kvcompass.topology import Worker
from kvcompass.wire import MAX_ITEMS, EventKind, KVEvent, KVEventBatch, WireError, encode

__all__ = ["EventPublisher", "Send"]

#: Delivers one encoded batch to a shard's partition of ``kvc.events``.
Send = Callable[[int, bytes], None]

#: Namespaces whose hashers are kept before the publisher forgets them all.
_MAX_HASHERS = 4096
#: Checked tuples of lengths kept per set of registration lengths (a worker's changes
#: use a few hundred runs of its lengths; every worker of a region has the same).
_MAX_CHECKED = 4096
#: Registration lengths -> their checked tuples, shared by the publishers of one region.
_CHECKED: dict[frozenset[int], dict[tuple[int, ...], tuple[int, ...]]] = {}


def _valid_columns() -> dict[tuple[EventKind, Tier], tuple[int, int]]:
    """The column values of every (kind, tier) a KVEvent accepts: its check runs once
    per pair here, not once per change."""
    valid = {}
    for kind in EventKind:
        for tier in Tier:
            with contextlib.suppress(WireError):
                KVEvent(kind, tier)
                valid[kind, tier] = (int(kind), int(tier))
    return valid


_COLUMNS: Final = _valid_columns()


class EventPublisher:
    """Builds and sends one worker's KV event batches.

    With ``max_buffered_keys`` > 0 the publisher buffers events per shard and sends
    them as one batch per shard when that many keys are waiting or on :meth:`flush`
    (call it once per engine step): fewer, larger batches cost the maintenance units
    much less per key. With 0 (the default) every change is sent at once.

    ``send`` None: no transport; the caller hands on the returned batch objects (the
    simulator, whose writers take them as they are, so nothing is encoded).

    ``incarnation`` defaults to a random 63-bit number (pass one to reproduce a run);
    ``clock`` stamps ``sent_at_ns`` and nothing else.
    """

    def __init__(
        self,
        worker: Worker,
        plan: LevelPlan,
        namespace: Namespace,
        n_shards: int,
        send: Send | None,
        max_buffered_keys: int = 0,
        *,
        incarnation: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.incarnation = (
            random.SystemRandom().getrandbits(63) if incarnation is None else incarnation
        )
        # Every batch's header is these fields, a shard below n_shards, a sequence number
        # and a clock reading: checked here once (WireError), not per batch.
        KVEventBatch(
            worker.id, worker.region, 0, n_shards - 1, 0, worker_incarnation=self.incarnation
        )
        self.worker = worker
        self.namespace = namespace
        self.n_shards = n_shards
        self.max_buffered_keys = max_buffered_keys
        self._lengths = plan.registration_lengths[worker.region]
        self._registered = frozenset(self._lengths)
        self._hasher = PrefixHasher(self._lengths, namespace, plan.key_hash)
        self._hashers: dict[Namespace, PrefixHasher] = {}
        self._checked_tuples = _CHECKED.setdefault(self._registered, {})
        self._send = send
        self._buffers = ShardEventBuffers(n_shards, MAX_ITEMS)
        # Batches numbered and not yet sent (a send raised): they go first next time.
        self._unsent: list[KVEventBatch] = []
        self.next_seq = 0
        self._clock = clock or SystemClock()

    def admit(self, tokens: TokenIds, tier: Tier = Tier.VRAM) -> list[KVEventBatch]:
        return self.publish(EventKind.ADMIT, tokens, tier)

    def move(self, tokens: TokenIds, tier: Tier) -> list[KVEventBatch]:
        return self.publish(EventKind.TIER, tokens, tier)

    def evict(self, tokens: TokenIds) -> list[KVEventBatch]:
        return self.publish(EventKind.EVICT, tokens, Tier.ABSENT)

    def publish(
        self,
        kind: EventKind,
        tokens: TokenIds,
        tier: Tier,
        *,
        namespace: Namespace | None = None,
        lengths: Collection[int] | None = None,
    ) -> list[KVEventBatch]:
        """Record the change of one cached prefix; returns the batches sent by this call.

        By default the change covers every registration length up to ``len(tokens)``.
        A worker whose cache knows which lengths changed (a prompt that extends a held
        prefix changes only the lengths beyond it) passes them as ``lengths``, a subset
        of the registration lengths; ``namespace`` overrides the publisher's own (one
        worker, one incarnation and one numbering, several tenants).
        """
        columns = _COLUMNS.get((kind, tier)) if type(kind) is EventKind else None
        if columns is None or type(tier) is not Tier:
            event = KVEvent(kind, tier)  # refuses a bad kind or tier now, not at the flush
            columns = int(event.kind), int(event.tier)
        hasher = self._hasher if namespace is None else self._hasher_of(namespace)
        lengths = self._lengths if lengths is None else self._checked(lengths)
        kind_value, tier_value = columns
        full = False
        if hasher.compiled:  # keyed and grouped by shard in one compiled call
            add, head = self._buffers.add_prefixes, hasher.head
            try:
                full = add(kind_value, tier_value, head, tokens, lengths)
            except TypeError:  # not a uint32 array: checked and converted first
                full = add(kind_value, tier_value, head, token_array(tokens), lengths)
        elif len(lengths) == 1:  # a demotion or an eviction: one length, one shard
            key = hasher.key_at(tokens, lengths[0])
            if key is not None:
                full = self._buffers.add_one(kind_value, tier_value, lengths[0], key)
        else:
            keys = hasher.key_array_at(tokens, lengths)  # at the first len(keys) of lengths
            full = self._buffers.add(kind_value, tier_value, lengths, keys)
        # A shard's batch holds at most MAX_ITEMS events: "full" says one has that many.
        if full or self._buffers.pending_keys >= self.max_buffered_keys:
            return self.flush()
        return []

    def _checked(self, lengths: Collection[int]) -> Sequence[int]:
        """``lengths`` ascending, each once; refused unless all are registration lengths.

        A cache reports its changes' lengths as tuples of a few registration lengths (a
        run of them), so a tuple's answer is kept for every publisher with these
        registration lengths: looking it up costs a fifth of the check.
        """
        if type(lengths) is tuple:
            known = self._checked_tuples.get(lengths)
            if known is not None:
                return known
        if not self._registered.issuperset(lengths):
            unknown = sorted(set(lengths) - self._registered)
            raise ValueError(f"lengths {unknown} are not registration lengths of {self.worker.id}")
        checked = sorted(set(lengths)) if len(lengths) > 1 else list(lengths)
        if type(lengths) is not tuple:
            return checked
        if len(self._checked_tuples) >= _MAX_CHECKED:
            self._checked_tuples.clear()
        kept = self._checked_tuples[lengths] = tuple(checked)  # shared: immutable
        return kept

    def _hasher_of(self, namespace: Namespace) -> PrefixHasher:
        """The registration lengths' hasher in ``namespace``, kept per namespace met."""
        hasher = self._hashers.get(namespace)
        if hasher is None:
            if len(self._hashers) >= _MAX_HASHERS:
                self._hashers.clear()  # many tenants: start over rather than grow
            hasher = self._hasher.for_namespace(namespace)
            self._hashers[namespace] = hasher
        return hasher

    def discard(self) -> int:
        """Drop every buffered event unsent; returns how many keys were dropped.

        For fault injection only (a worker whose updates are lost: the index keeps
        claiming what it no longer holds). Buffered events have no sequence numbers yet;
        batches a failed send left unsent are dropped too, their numbers unused.
        """
        dropped = self._buffers.discard() + sum(batch.n_keys for batch in self._unsent)
        self._unsent.clear()
        return dropped

    def announce(self) -> list[KVEventBatch]:
        """Send a batch to every shard (empty unless events are buffered for it): each
        shard's maintenance unit learns of this incarnation now and drops what the
        worker's earlier runs cached there. Call it when the worker starts; a shard
        that never receives a change would otherwise keep those stale claims."""
        self._buffers.mark_all()
        return self.flush()

    def flush(self) -> list[KVEventBatch]:
        """Send every buffered event: one batch per shard, in shard order.

        A send that raises loses nothing: the batches it did not send keep their
        sequence numbers and go first at the next flush (a shard still gets its batches
        in order)."""
        now = stamp_ns(self._clock)  # before anything is taken: a bad clock loses nothing
        for shard, kinds, tiers, counts, lengths, keys in self._buffers.take():
            batch = KVEventBatch.from_valid_columns(
                self.worker.id,
                self.worker.region,
                self.next_seq,
                shard,
                now,
                kinds=kinds,
                tiers=tiers,
                counts=counts,
                lengths=lengths,
                keys=keys,
                worker_incarnation=self.incarnation,
            )
            self.next_seq += 1
            self._unsent.append(batch)
        sent: list[KVEventBatch] = []
        try:
            for batch in self._unsent:
                if self._send is not None:
                    self._send(batch.shard, encode(batch))
                sent.append(batch)
        finally:
            del self._unsent[: len(sent)]
        return sent
