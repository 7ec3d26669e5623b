"""REFERENCE ORACLE FOR TESTS ONLY: the behaviour of ``kvcompass.worker.cache`` as of
9d398ef, before its steady-state speed-up (its eviction heap, demotion and removal code,
frozen). The value types it returns (``CacheMatch``, ``PrefixChange``, ``EvictionPolicy``)
are the real module's, not copies. Nothing outside tests/ may import it, and its
behaviour is never to be edited or "fixed": test_worker_cache_equivalence.py checks that
the real cache behaves exactly like it (matches, blocks held, every reported change in
order). The real module's docstring describes the design both follow.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, TokenIds
from kvcompass.levels import plan_levels
from kvcompass.topology import Topology, Worker
from kvcompass.wire import EventKind
from kvcompass.worker.cache import CacheMatch, EvictionPolicy, OnChange, PrefixChange

__all__ = ["CacheMatch", "EvictionPolicy", "OnChange", "PrefixCache", "PrefixChange"]

_TOKEN = np.dtype("<u4")


class _Block:
    __slots__ = (
        "born",
        "children",
        "data",
        "depth",
        "last_use",
        "namespace",
        "parent",
        "pin",
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
        tier: Tier,
        tick: int,
        pin: int = 0,
        uses: int = 0,
    ) -> None:
        self.namespace = namespace
        self.parent: _Block | None = parent  # None for a root and for a removed block
        self.data = data  # the block's token ids, uint32 LE
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.children: dict[bytes, _Block] = {}
        self.tier = tier
        self.born = self.last_use = tick
        self.uses = uses
        self.pin = pin  # the operation that pinned it
        self.version = 0  # bumped whenever its eviction order or tier changes
        self.vram_children = 0  # kept by set_tier, detach and admission (_hold)

    def set_tier(self, tier: Tier) -> None:
        if self.parent is not None and tier is not self.tier:
            self.parent.vram_children += 1 if tier is Tier.VRAM else -1
        self.tier = tier

    def detach(self) -> None:
        assert self.parent is not None
        del self.parent.children[self.data]
        self.parent.vram_children -= self.tier is Tier.VRAM

    def path_data(self) -> bytes:
        parts = []
        node: _Block | None = self
        while node is not None and node.parent is not None:
            parts.append(node.data)
            node = node.parent
        return b"".join(reversed(parts))


class PrefixCache:
    """Blocks of cached prompts in VRAM and DRAM; see the module docstring.

    ``registration_lengths`` are the lengths the worker registers at (block multiples);
    ``on_change`` receives every change at them, in the order they happen.
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
        self.capacity = {Tier.VRAM: vram_blocks, Tier.DRAM: dram_blocks}
        self.used = {Tier.VRAM: 0, Tier.DRAM: 0}
        self.policy = EvictionPolicy(policy)
        self._registered_depths = {c // block_size for c in registration_lengths}
        self._on_change = on_change
        self._roots: dict[Namespace, _Block] = {}
        self._heaps: dict[Tier, list[tuple[Any, int, int, _Block]]] = {Tier.VRAM: [], Tier.DRAM: []}
        self._ticks = itertools.count(1)
        self._entries = itertools.count()
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

    # -- changing --------------------------------------------------------------------

    def use(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch:
        """Serve a prompt: returns what was held before (the reuse), then holds every
        full block of it in VRAM (promoting DRAM blocks, admitting new ones) and records
        the use. A prompt longer than VRAM keeps only its first VRAM-full of blocks."""
        return self._hold(namespace, tokens, Tier.VRAM)

    def load(self, namespace: Namespace, tokens: TokenIds) -> CacheMatch:
        """Hold a migrated prefix: new blocks go to DRAM (VRAM when the worker has no
        DRAM); held blocks keep their tier. Returns what was held before."""
        tier = Tier.DRAM if self.capacity[Tier.DRAM] else Tier.VRAM
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

    # -- internals -------------------------------------------------------------------

    def _path(self, namespace: Namespace, data: bytes) -> list[_Block]:
        """The held blocks of the prompt ``data``, root first (a list: two walks per
        request over ~200 blocks, where a generator's per-block resume shows)."""
        path: list[_Block] = []
        node = self._roots.get(namespace)
        if node is None:
            return path
        width = self.block_size * _TOKEN.itemsize
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
            if node.tier is not Tier.DRAM:
                break
            dram += 1
        return CacheMatch(len(path) * self.block_size, dram * self.block_size)

    def _hold(self, namespace: Namespace, tokens: TokenIds, tier: Tier) -> CacheMatch:
        data = _as_bytes(tokens)
        width = self.block_size * _TOKEN.itemsize
        path = self._path(namespace, data)
        before = self._summary(path)
        n_blocks = min(len(data) // width, self.capacity[tier])
        self._op += 1
        tick = next(self._ticks)
        promoted: list[_Block] = []
        admitted: list[_Block] = []
        for node in path[:n_blocks]:
            node.pin = self._op
            if tier is Tier.VRAM and node.tier is Tier.DRAM:
                if not self._promote(node):
                    n_blocks = node.depth - 1  # no room: hold only what precedes it
                    break
                promoted.append(node)
            # _touch, inlined (once per held block): only a frontier block is queued
            node.last_use = tick
            node.uses += 1
            node.version += 1
            if not (node.vram_children if node.tier is Tier.VRAM else node.children):
                self._offer(node)
        if n_blocks > len(path):
            parent = path[-1] if path else self._root(namespace)
            # The loop runs once per new block (~150 for a long prompt), so it attaches
            # each in place and looks for no eviction while the tier has room
            # (_make_room would find nothing to do).
            room = self.capacity[tier] - self.used[tier]
            vram = tier is Tier.VRAM
            used = self.used
            op = self._op
            for start in range(len(path) * width, n_blocks * width, width):
                if room > 0:
                    room -= 1
                elif not self._make_room(tier):
                    break
                block = data[start : start + width]
                node = _Block(namespace, parent, block, tier, tick, op, 1)
                parent.children[block] = node
                parent.vram_children += vram
                used[tier] += 1
                admitted.append(node)
                parent = node
            if admitted:
                # Only the deepest is a frontier block: its ancestors each have a child
                # now, and become candidates through the removal or demotion below them.
                self._offer(admitted[-1])
        self._report(promoted, EventKind.TIER, Tier.VRAM, data)
        self._report(admitted, EventKind.ADMIT, tier, data)
        return before

    def _root(self, namespace: Namespace) -> _Block:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = _Block(namespace, None, b"", Tier.VRAM, 0)
        return root

    def _promote(self, node: _Block) -> bool:
        # Its DRAM slot is freed first, so a demotion made to fit it can take that slot.
        node.set_tier(Tier.VRAM)
        self.used[Tier.DRAM] -= 1
        if not self._make_room(Tier.VRAM):
            node.set_tier(Tier.DRAM)
            self.used[Tier.DRAM] += 1
            return False
        self.used[Tier.VRAM] += 1
        node.version += 1
        self._offer(node)
        return True

    def _make_room(self, tier: Tier) -> bool:
        """Free one block of ``tier`` if it is full; False when nothing may leave."""
        while self.used[tier] >= self.capacity[tier]:
            victim = self._victim(tier)
            if victim is None:
                return False
            if tier is Tier.DRAM or self.capacity[Tier.DRAM] == 0:
                self._remove(victim)
            elif not self._demote(victim):
                return False
        return True

    def _demote(self, node: _Block) -> bool:
        node.set_tier(Tier.DRAM)  # before making room, so it is not its own victim
        self.used[Tier.VRAM] -= 1
        if not self._make_room(Tier.DRAM):
            node.set_tier(Tier.VRAM)
            self.used[Tier.VRAM] += 1
            self._offer(node)
            return False
        self.used[Tier.DRAM] += 1
        node.version += 1
        self._offer(node)
        if node.parent is not None:
            self._offer(node.parent)  # it may have lost its last VRAM child
        if node.depth in self._registered_depths:
            self._report([node], EventKind.TIER, Tier.DRAM)
        return True

    def _remove(self, node: _Block) -> None:
        parent = node.parent
        assert parent is not None, "the root is never removed"
        assert not node.children, "only leaves leave the cache"
        node.detach()
        self.used[node.tier] -= 1
        node.version += 1
        node.parent = None  # marks it gone for the heaps
        self._offer(parent)  # a root stays, even empty: a prompt may be growing under it
        if node.depth in self._registered_depths:
            tokens = np.frombuffer(parent.path_data() + node.data, dtype=_TOKEN)
            length = node.depth * self.block_size
            self._emit(node.namespace, EventKind.EVICT, Tier.ABSENT, tokens, (length,))

    def _candidate(self, node: _Block, tier: Tier) -> bool:
        if node.parent is None or node.tier is not tier:
            return False
        return not node.children if tier is Tier.DRAM else not node.vram_children

    def _order(self, node: _Block) -> tuple[int, ...]:
        if self.policy is EvictionPolicy.LRU:
            return (node.last_use, -node.depth)
        if self.policy is EvictionPolicy.LFU:
            return (node.uses, node.last_use, -node.depth)
        return (node.born, -node.depth)

    def _offer(self, node: _Block) -> None:
        """Queue ``node`` as a victim of its tier if it is a frontier block now."""
        if self._candidate(node, node.tier):
            heap = self._heaps[node.tier]
            heapq.heappush(heap, (self._order(node), next(self._entries), node.version, node))
            if len(heap) > 4 * self.capacity[node.tier] + 64:
                self._rebuild(node.tier)

    def _rebuild(self, tier: Tier) -> None:
        heap = [
            (self._order(n), next(self._entries), n.version, n)
            for root in self._roots.values()
            for n in _subtree(root)
            if self._candidate(n, tier)
        ]
        heapq.heapify(heap)
        self._heaps[tier] = heap

    def _victim(self, tier: Tier) -> _Block | None:
        heap = self._heaps[tier]
        pinned = []
        victim = None
        while heap:
            entry = heapq.heappop(heap)
            node = entry[3]
            if entry[2] != node.version or not self._candidate(node, tier):
                continue  # stale: superseded by a later entry or no longer a frontier
            if node.pin == self._op:
                pinned.append(entry)
                continue
            victim = node
            break
        for entry in pinned:
            heapq.heappush(heap, entry)
        return victim

    def _report(
        self, nodes: list[_Block], kind: EventKind, tier: Tier, prompt: bytes | None = None
    ) -> None:
        """One change per run of nodes along one path (one prompt's promoted / admitted
        blocks, ``prompt`` that path's bytes when known), at the registration lengths
        among them."""
        registered = [n for n in nodes if n.depth in self._registered_depths]
        if not registered:
            return
        last = max(registered, key=lambda n: n.depth)
        if prompt is None:
            path = last.path_data()
        else:  # the same bytes without walking up ~200 blocks
            path = prompt[: last.depth * self.block_size * _TOKEN.itemsize]
        tokens = np.frombuffer(path, dtype=_TOKEN)
        lengths = tuple(sorted(n.depth * self.block_size for n in registered))
        self._emit(last.namespace, kind, tier, tokens, lengths)

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
