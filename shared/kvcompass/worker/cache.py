"""A worker's two-tier prefix KV cache, by blocks (paper §3.1, §5.1; DESIGN §9).

Per namespace a radix tree of blocks: each node is one block of ``block_size`` token ids
and its path from the root is the prefix it completes, so a prefix of ``c`` tokens
(``c`` a block multiple) is held iff the node at depth ``c / block_size`` exists.
Capacities are counted in blocks and shared by every namespace (one GPU, one host).

Two invariants keep every held prefix contiguous and give it one tier:

- a DRAM block's children are DRAM blocks, so along any path the VRAM blocks come
  first and a prefix's tier is the tier of its last block;
- only *frontier* blocks leave a tier: a VRAM block with no VRAM child is demoted to
  DRAM, and a DRAM block with no child at all is evicted.

Which frontier block goes first is the eviction policy (LRU, LFU or FIFO, paper Fig. 6);
the blocks of the prompt being served are pinned for the operation. The index only
needs the lengths edges query, so the cache reports a change through ``on_change`` only
when the node at a registration length is admitted, changes tier or is evicted: a prompt
that extends a held prefix within one registration interval reports nothing.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, TokenIds
from kvcompass.levels import plan_levels
from kvcompass.topology import Topology, Worker
from kvcompass.wire import EventKind

__all__ = ["CacheMatch", "EvictionPolicy", "OnChange", "PrefixCache", "PrefixChange"]

_TOKEN = np.dtype("<u4")


class EvictionPolicy(StrEnum):
    """Which frontier block leaves its tier first."""

    LRU = "lru"  # least recently used
    LFU = "lfu"  # fewest uses (ties: least recently used)
    FIFO = "fifo"  # cached earliest (promotion and reuse do not renew it)


@dataclass(frozen=True, slots=True)
class PrefixChange:
    """One change the index must learn: the prefixes of ``tokens`` at ``lengths``."""

    namespace: Namespace
    kind: EventKind
    tier: Tier  # ABSENT for an eviction
    tokens: NDArray[np.uint32]  # as long as the longest of ``lengths``
    lengths: tuple[int, ...]  # ascending registration lengths


OnChange = Callable[[PrefixChange], None]


@dataclass(frozen=True, slots=True)
class CacheMatch:
    """The held prefix of a prompt: ``tokens`` long, the last ``dram_tokens`` in DRAM."""

    tokens: int = 0
    dram_tokens: int = 0

    @property
    def tier(self) -> Tier:
        if self.tokens == 0:
            return Tier.ABSENT
        return Tier.DRAM if self.dram_tokens else Tier.VRAM


_VRAM, _DRAM = Tier.VRAM, Tier.DRAM


class _Block:
    __slots__ = (
        "children",
        "data",
        "depth",
        "key",
        "namespace",
        "parent",
        "pin",
        "source",
        "tier",
        "uses",
        "version",
        "vram_children",
    )

    def __init__(
        self,
        namespace: Namespace,
        parent: _Block | None,
        data: bytes,
        source: bytes,
        tier: Tier,
        depth: int,
        key: Any,
        pin: int = 0,
        uses: int = 0,
    ) -> None:
        self.namespace = namespace
        self.parent: _Block | None = parent  # None for a root and for a removed block
        self.data = data  # the block's token ids, uint32 LE (its key in parent.children)
        # The prompt that admitted it, which starts with its whole path: a report slices
        # it instead of walking up hundreds of blocks. A reference, not a copy; it keeps
        # that prompt's bytes alive while any block it admitted is held.
        self.source = source
        self.depth = depth
        self.children: dict[bytes, _Block] = {}
        self.tier = tier
        self.key = key  # eviction order, smallest first (PrefixCache._hold sets it)
        self.uses = uses
        self.pin = pin  # the operation that pinned it
        self.version = 0  # bumped whenever its eviction order or tier changes
        self.vram_children = 0  # kept by promotion, demotion, removal and admission

    def path_data(self) -> bytes:
        return self.source[: self.depth * len(self.data)]


class PrefixCache:
    """Blocks of cached prompts in VRAM and DRAM; see the module docstring.

    ``registration_lengths`` are the lengths the worker registers at (block multiples);
    ``on_change`` receives every change at them, in the order they happen.

    Each tier's frontier blocks wait in a heap of ``(key, version, block)`` entries,
    pushed whenever a block may have become a frontier block or its order changed and
    checked when popped (an entry whose version is old, or whose block is no longer a
    frontier block of that tier, is dropped). ``key`` encodes the policy's order, an int
    so that comparing two entries is one int comparison: LRU ``(last use, -depth)`` is
    ``last_use * depth_scale - depth`` (every depth is below ``depth_scale``), FIFO the
    same with the admission tick, LFU ``(uses, that int)``. Two blocks never share a key
    (one path is touched per tick), so the order is total: among one block's entries
    the version orders them by age, and two equal entries are the same block's (tuple
    comparison stops at identical items, so it never compares blocks).
    """

    def __init__(
        self,
        block_size: int,
        vram_blocks: int,
        dram_blocks: int,
        registration_lengths: Sequence[int],
        policy: EvictionPolicy = EvictionPolicy.LRU,
        on_change: OnChange | None = None,
    ) -> None:
        if block_size < 1 or vram_blocks < 1 or dram_blocks < 0:
            raise ValueError("block_size and vram_blocks must be positive, dram_blocks >= 0")
        if any(c % block_size for c in registration_lengths):
            raise ValueError(f"registration lengths must be multiples of {block_size}")
        self.block_size = block_size
        self.capacity = {_VRAM: vram_blocks, _DRAM: dram_blocks}
        self.used = {_VRAM: 0, _DRAM: 0}
        self.policy = EvictionPolicy(policy)
        self._registered_depths = frozenset(c // block_size for c in registration_lengths)
        self._registered = sorted(self._registered_depths)
        self._width = block_size * _TOKEN.itemsize
        self._on_change = on_change
        self._roots: dict[Namespace, _Block] = {}
        self._heaps: dict[Tier, list[tuple[Any, int, _Block]]] = {_VRAM: [], _DRAM: []}
        self._next: dict[Tier, tuple[Any, int, _Block] | None] = {_VRAM: None, _DRAM: None}
        # A heap is rebuilt from the tree when stale entries make it this long.
        self._heap_limit = {tier: 4 * n + 64 for tier, n in self.capacity.items()}
        self._depth_scale = 1 << (vram_blocks + dram_blocks).bit_length()
        self._ticks = itertools.count(1)
        self._op = 0

    @classmethod
    def for_worker(
        cls,
        topology: Topology,
        worker: Worker,
        policy: EvictionPolicy = EvictionPolicy.LRU,
        on_change: OnChange | None = None,
    ) -> PrefixCache:
        """A cache sized from the worker's memory: bytes ÷ (KV bytes per token × block)."""
        block = topology.index.block_size
        block_bytes = topology.model.kv_bytes_per_token * block
        return cls(
            block,
            worker.vram_bytes // block_bytes,
            worker.dram_bytes // block_bytes,
            plan_levels(topology).registration_lengths[worker.region],
            policy,
            on_change,
        )

    # -- reading ---------------------------------------------------------------------

    def match(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch:
        """The longest held prefix of ``tokens`` (read-only: no use is recorded)."""
        return self._summary(self._path(namespace, _as_bytes(tokens)))

    def blocks(self, tier: Tier) -> int:
        return self.used[tier]

    def held(self) -> Iterator[PrefixChange]:
        """The whole state as ADMIT changes: every held prefix at a registration length,
        in its tier (for a worker that must tell the index everything again)."""
        registered, block = self._registered_depths, self.block_size
        for namespace, root in self._roots.items():
            for node in _subtree(root):
                if node.depth in registered:
                    tokens = np.frombuffer(node.path_data(), dtype=_TOKEN)
                    length = (node.depth * block,)
                    yield PrefixChange(namespace, EventKind.ADMIT, node.tier, tokens, length)

    # -- changing --------------------------------------------------------------------

    def use(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch:
        """Serve a prompt: returns what was held before (the reuse), then holds every
        full block of it in VRAM (promoting DRAM blocks, admitting new ones) and records
        the use. A prompt longer than VRAM keeps only its first VRAM-full of blocks."""
        return self._hold(namespace, tokens, _VRAM)

    def load(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch:
        """Hold a migrated prefix: new blocks go to DRAM (VRAM when the worker has no
        DRAM); held blocks keep their tier. Returns what was held before."""
        tier = _DRAM if self.capacity[_DRAM] else _VRAM
        return self._hold(namespace, tokens, tier)

    def clear(self) -> None:
        """Evict everything, reporting every held registration length."""
        for root in list(self._roots.values()):
            for node in reversed(list(_subtree(root))):
                if node.parent is not None:
                    self._remove(node)
        self._roots.clear()
        for heap in self._heaps.values():
            heap.clear()
        self._next = dict.fromkeys(self._next)

    # -- internals -------------------------------------------------------------------

    def _path(self, namespace: Namespace, data: bytes) -> list[_Block]:
        """The held blocks of the prompt ``data``, root first (a list: two walks per
        request over ~200 blocks, where a generator's per-block resume shows)."""
        path: list[_Block] = []
        node = self._roots.get(namespace)
        if node is None:
            return path
        width = self._width
        for start in range(0, len(data) - width + 1, width):
            node = node.children.get(data[start : start + width])
            if node is None:
                break
            path.append(node)
        return path

    def _summary(self, path: list[_Block]) -> CacheMatch:
        # A path's DRAM blocks are its tail (a DRAM block's children are DRAM blocks).
        dram = 0
        for node in reversed(path):
            if node.tier is not _DRAM:
                break
            dram += 1
        return CacheMatch(len(path) * self.block_size, dram * self.block_size)

    def _hold(self, namespace: Namespace, tokens: TokenIds, tier: Tier) -> CacheMatch:
        data = _as_bytes(tokens)
        width = self._width
        path = self._path(namespace, data)
        before = self._summary(path)
        n_blocks = min(len(data) // width, self.capacity[tier])
        self._op += 1
        op = self._op
        tick = next(self._ticks)
        base = tick * self._depth_scale  # a block's LRU key this tick: base - depth
        lru = self.policy is EvictionPolicy.LRU
        lfu = self.policy is EvictionPolicy.LFU
        vram = tier is _VRAM
        promoted: list[_Block] = []
        for node in path[:n_blocks]:
            node.pin = op
            if vram and node.tier is _DRAM:
                if not self._promote(node):
                    n_blocks = node.depth - 1  # no room: hold only what precedes it
                    break
                promoted.append(node)
            # the use, inlined (once per held block): only a frontier block is queued
            node.uses += 1
            if lru:
                node.key = base - node.depth
            elif lfu:
                node.key = (node.uses, base - node.depth)
            node.version += 1
            if not (node.vram_children if node.tier is _VRAM else node.children):
                self._queue(node)
        admitted: tuple[int, int] | None = None  # depths of the first and last new block
        if n_blocks > len(path):
            parent = first = path[-1] if path else self._root(namespace)
            # The loop runs once per new block (~150 for a long prompt), so it attaches
            # each in place and looks for no eviction while the tier has room
            # (_make_room would find nothing to do).
            used = self.used
            room = self.capacity[tier] - used[tier]
            depth = parent.depth
            for start in range(len(path) * width, n_blocks * width, width):
                if room > 0:
                    room -= 1
                elif not self._make_room(tier):
                    break
                depth += 1
                key = (1, base - depth) if lfu else base - depth
                block = data[start : start + width]
                node = _Block(namespace, parent, block, data, tier, depth, key, op, 1)
                parent.children[block] = node
                parent.vram_children += vram
                used[tier] += 1
                parent = node
            if parent is not first:
                # Only the deepest is a frontier block: its ancestors each have a child
                # now, and become candidates through the removal or demotion below them.
                self._queue(parent)
                admitted = (first.depth + 1, parent.depth)
        if promoted:
            span = (promoted[0].depth, promoted[-1].depth)  # one run: a path's DRAM tail
            self._report(namespace, EventKind.TIER, _VRAM, data, span)
        if admitted:
            self._report(namespace, EventKind.ADMIT, tier, data, admitted)
        return before

    def _root(self, namespace: Namespace) -> _Block:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = _Block(namespace, None, b"", b"", _VRAM, 0, 0)
        return root

    def _promote(self, node: _Block) -> bool:
        parent = node.parent
        assert parent is not None, "a held block"
        # Its DRAM slot is freed first, so a demotion made to fit it can take that slot.
        node.tier = _VRAM
        parent.vram_children += 1
        used = self.used
        used[_DRAM] -= 1
        if used[_VRAM] >= self.capacity[_VRAM] and not self._make_room(_VRAM):
            node.tier = _DRAM
            parent.vram_children -= 1
            used[_DRAM] += 1
            return False
        used[_VRAM] += 1
        node.version += 1
        self._queue(node)  # a frontier block: its children are all in DRAM
        return True

    def _make_room(self, tier: Tier) -> bool:
        """Free one block of ``tier`` if it is full; False when nothing may leave."""
        capacity = self.capacity
        if tier is _DRAM or not capacity[_DRAM]:
            return self._evict(tier)
        # Demote VRAM's victim to DRAM, evicting DRAM's for it: in the steady state once
        # per admitted block, so it is written out here rather than as calls.
        used = self.used
        while used[_VRAM] >= capacity[_VRAM]:
            node = self._victim(_VRAM)
            if node is None:
                return False
            parent = node.parent
            assert parent is not None, "a victim is held"
            node.tier = _DRAM  # its VRAM slot is free while DRAM makes room
            parent.vram_children -= 1
            used[_VRAM] -= 1
            while used[_DRAM] >= capacity[_DRAM]:
                leaf = self._victim(_DRAM)
                if leaf is None:
                    node.tier = _VRAM
                    parent.vram_children += 1
                    used[_VRAM] += 1
                    self._queue(node)  # still a frontier block: it was a victim
                    return False
                self._remove(leaf)
            used[_DRAM] += 1
            node.version += 1
            if not node.children:  # a DRAM frontier block
                heap = self._heaps[_DRAM]
                heapq.heappush(heap, (node.key, node.version, node))
                if len(heap) > self._heap_limit[_DRAM]:
                    self._rebuild(_DRAM)
            if parent.parent is not None and not parent.vram_children:
                # It lost its last VRAM child (a VRAM block's parent is a VRAM block).
                self._queue_next(parent)
            if node.depth in self._registered_depths:
                tokens = np.frombuffer(node.path_data(), dtype=_TOKEN)
                length = node.depth * self.block_size
                self._emit(node.namespace, EventKind.TIER, _DRAM, tokens, (length,))
        return True

    def _evict(self, tier: Tier) -> bool:
        """Remove blocks of ``tier`` until it has room; False when nothing may leave."""
        used, full = self.used, self.capacity[tier]
        while used[tier] >= full:
            victim = self._victim(tier)
            if victim is None:
                return False
            self._remove(victim)
        return True

    def _remove(self, node: _Block) -> None:
        parent = node.parent
        assert parent is not None, "the root is never removed"
        assert not node.children, "only leaves leave the cache"
        del parent.children[node.data]
        tier = node.tier
        if tier is _VRAM:
            parent.vram_children -= 1
        self.used[tier] -= 1
        node.version += 1
        node.parent = None  # marks it gone for the heaps
        # A root stays, even empty: a prompt may be growing under it.
        if parent.parent is not None and not (
            parent.children if parent.tier is _DRAM else parent.vram_children
        ):
            self._queue_next(parent)
        if node.depth in self._registered_depths:
            tokens = np.frombuffer(node.path_data(), dtype=_TOKEN)
            length = node.depth * self.block_size
            self._emit(node.namespace, EventKind.EVICT, Tier.ABSENT, tokens, (length,))

    def _candidate(self, node: _Block, tier: Tier) -> bool:
        if node.parent is None or node.tier is not tier:
            return False
        return not node.children if tier is _DRAM else not node.vram_children

    def _queue(self, node: _Block) -> None:
        """Queue the frontier block ``node`` as a victim of its tier."""
        tier = node.tier
        heap = self._heaps[tier]
        heapq.heappush(heap, (node.key, node.version, node))
        if len(heap) > self._heap_limit[tier]:
            self._rebuild(tier)

    def _queue_next(self, node: _Block) -> None:
        """Queue the frontier block ``node``, likely its tier's next victim, beside the
        heap: the parent a demotion or removal has just bared. LRU and FIFO empty a tier
        a path at a time, bottom up, so the next victim search takes it from there
        without a push and a pop; the one it displaces goes into the heap."""
        tier = node.tier
        displaced = self._next[tier]
        self._next[tier] = (node.key, node.version, node)
        if displaced is not None:
            heap = self._heaps[tier]
            heapq.heappush(heap, displaced)
            if len(heap) > self._heap_limit[tier]:
                self._rebuild(tier)

    def _rebuild(self, tier: Tier) -> None:
        """Drop the heap's stale entries; it changes no victim. Every frontier block
        has a live entry: it was queued when it last became one or changed order, and
        the one way back to the frontier without a queueing (a child's promotion that
        fails after a victim search dropped the parent's entry) never happens: a prompt
        holds at most VRAM-many blocks, so some unpinned VRAM block can always move to
        the DRAM slot the promotion freed."""
        heap = self._heaps[tier]  # in place: callers may hold the list
        heap[:] = [
            (n.key, n.version, n)
            for root in self._roots.values()
            for n in _subtree(root)
            if self._candidate(n, tier)
        ]
        heapq.heapify(heap)
        self._next[tier] = None

    def _victim(self, tier: Tier) -> _Block | None:
        """The first unpinned frontier block of ``tier`` (by key) from the heap and the
        entry beside it, taken out; None when every frontier block is pinned."""
        heap = self._heaps[tier]
        beside = self._next[tier]
        self._next[tier] = None
        dram = tier is _DRAM
        op = self._op
        pinned = []
        victim = None
        while True:
            if beside is not None and (not heap or beside < heap[0]):
                entry, beside = beside, None
            elif heap:
                entry = heapq.heappop(heap)
            else:
                break
            node = entry[2]
            if (
                entry[1] != node.version
                or node.parent is None
                or node.tier is not tier
                or (node.children if dram else node.vram_children)
            ):
                continue  # stale: superseded by a later entry or no longer a frontier
            if node.pin == op:
                pinned.append(entry)
                continue
            victim = node
            break
        self._next[tier] = beside
        for entry in pinned:
            heapq.heappush(heap, entry)
        return victim

    def _report(
        self,
        namespace: Namespace,
        kind: EventKind,
        tier: Tier,
        prompt: bytes,
        span: tuple[int, int],
    ) -> None:
        """One change for the blocks of ``prompt`` at depths ``span`` (first, last; one
        prompt's promoted or admitted blocks), at the registration lengths among them."""
        first, last = span
        lengths = tuple(d * self.block_size for d in self._registered if first <= d <= last)
        if lengths:
            tokens = np.frombuffer(prompt[: lengths[-1] * _TOKEN.itemsize], dtype=_TOKEN)
            self._emit(namespace, kind, tier, tokens, lengths)

    def _emit(
        self,
        namespace: Namespace,
        kind: EventKind,
        tier: Tier,
        tokens: NDArray[np.uint32],
        lengths: tuple[int, ...],
    ) -> None:
        if self._on_change is not None:
            self._on_change(PrefixChange(namespace, kind, tier, tokens, lengths))


def _subtree(root: _Block) -> Iterator[_Block]:
    """``root`` and its descendants, parents before children."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def _as_bytes(tokens: TokenIds) -> bytes:
    return np.ascontiguousarray(tokens, dtype=_TOKEN).tobytes()
