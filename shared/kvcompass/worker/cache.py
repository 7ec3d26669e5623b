"""A worker's two-tier prefix KV cache, by blocks (paper §3.1, §5.1; DESIGN §9).

Per namespace a radix tree of blocks: each node is one block of ``block_size`` token ids
and its path from the root is the prefix it completes, so a prefix of ``c`` tokens
(``c`` a block multiple) is held iff the node at depth ``c / block_size`` exists. The
tree is stored path-compressed: a chain of blocks in the same state is one run, so a
prompt of a few hundred blocks is walked and admitted in a few steps, not one per block.
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

import bisect
import heapq
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import InvariantBroken
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

#: An eviction-heap entry: (the key of a run's last block, the run's version, the run).
_Entry = tuple[Any, int, "_Run"]


class _Run:
    """The blocks at depths ``first..last`` of one path, in one state.

    Every block of a run has the same tier, use count, eviction base (a block's key is
    derived from ``base - depth``) and pin, and each but the last has exactly one child,
    the next block of the run. So a run's last block is the only one that can be a
    frontier block, and a prompt walks a run with one bytes comparison instead of a
    lookup per block. A root is a run of no blocks (depth 0).
    """

    __slots__ = (
        "base",
        "children",
        "first",
        "last",
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
        parent: _Run | None,
        source: bytes,
        first: int,
        last: int,
        tier: Tier,
        base: int,
        uses: int,
        pin: int,
        version: int,
    ) -> None:
        self.namespace = namespace
        self.parent: _Run | None = parent  # None for a root and for a removed run
        # A prompt that starts with the run's whole path: block d is its slice
        # [(d - 1) * width, d * width). A reference, not a copy; it keeps that prompt's
        # bytes alive while the run is held.
        self.source = source
        self.first = first
        self.last = last
        self.children: dict[bytes, _Run] = {}  # the last block's, by their first block
        self.tier = tier
        self.base = base
        self.uses = uses
        self.pin = pin  # the operation that pinned it
        self.version = version  # renewed whenever the last block's key or tier changes
        self.vram_children = 0  # VRAM runs among ``children``


class PrefixCache:
    """Blocks of cached prompts in VRAM and DRAM; see the module docstring.

    ``registration_lengths`` are the lengths the worker registers at (block multiples);
    ``on_change`` receives every change at them, in the order they happen.

    The tree is kept as runs (:class:`_Run`): a prompt's new blocks are one run, and a
    run is split only where its blocks' states part (a later prompt uses, promotes or
    branches off part of it) and grows when a neighbour's block takes its state (a
    demotion or promotion streaming through a run). Each tier's frontier blocks wait in
    a heap of ``(key, version, run)`` entries for the run's last block, pushed whenever
    one may have become a frontier block or its order changed and checked when popped
    (an entry whose version is old, or whose run's last block is no longer a frontier
    block of that tier, is dropped). ``key`` encodes the policy's order, an int so that
    comparing two entries is one int comparison: LRU ``(last use, -depth)`` is
    ``last_use * depth_scale - depth`` (every depth is below ``depth_scale``), FIFO the
    same with the admission tick, LFU ``(uses, that int)``. Two blocks never share a key
    (one path is touched per tick), so the order is total; versions come from one
    counter, so two entries alike in key and version are the same run's (tuple
    comparison stops at identical items, so it never compares runs).
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
        self._lfu = self.policy is EvictionPolicy.LFU
        self._fifo = self.policy is EvictionPolicy.FIFO
        self._registered_depths = frozenset(c // block_size for c in registration_lengths)
        # Ascending, with their lengths in tokens: a change's lengths are a slice of them.
        self._registered = sorted(self._registered_depths)
        self._registered_lengths = tuple(d * block_size for d in self._registered)
        self._width = block_size * _TOKEN.itemsize
        self._on_change = on_change
        self._roots: dict[Namespace, _Run] = {}
        self._heaps: dict[Tier, list[_Entry]] = {_VRAM: [], _DRAM: []}
        self._next: dict[Tier, _Entry | None] = {_VRAM: None, _DRAM: None}
        # A heap is rebuilt from the tree when stale entries make it this long.
        self._heap_limit = {tier: 4 * n + 64 for tier, n in self.capacity.items()}
        self._depth_scale = 1 << (vram_blocks + dram_blocks).bit_length()
        self._ticks = itertools.count(1)
        self._versions = itertools.count(1)
        self._op = 0
        # The last match's walk (namespace, prompt bytes, path), until the cache changes.
        self._walked: tuple[Namespace, bytes, list[tuple[_Run, int]]] | None = None
        #: Victim queues rebuilt from the tree so far (the rare path that drops stale
        #: entries; it changes no victim).
        self.rebuilds = 0

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
        data = _as_bytes(tokens)
        path = self._walk(namespace, data)
        # An engine matches a prompt as it arrives and, on an idle worker, uses it at
        # once: until the cache changes, that use walks no further.
        self._walked = (namespace, data, path)
        return self._summary(path)

    def blocks(self, tier: Tier) -> int:
        return self.used[tier]

    def check(self) -> None:
        """Raise InvariantBroken naming the first broken invariant (tests and debugging;
        it walks the whole cache): every run a chain of blocks right after its parent's
        last block, keyed by its first block, its source starting with its whole path;
        a DRAM block's children DRAM, and each run's count of VRAM children right; the
        blocks held adding up to ``used``; every frontier block with a live entry in its
        tier's victim queue (what keeps a queue's rebuild from changing a victim)."""
        width = self._width
        live = {
            (tier, id(entry[2]))
            for tier, heap in self._heaps.items()
            for entry in [*heap, self._next[tier]]
            if entry is not None and entry[1] == entry[2].version
        }
        held = dict.fromkeys(self.used, 0)
        for root in self._roots.values():
            for run in _runs(root):
                at = f"{run.namespace} blocks {run.first}..{run.last}"
                vram = 0
                for key, child in run.children.items():
                    below = f"{at}, child {child.first}..{child.last}"
                    _require(child.parent is run, f"{below}: its parent link is elsewhere")
                    _require(child.first == run.last + 1 <= child.last, f"{below}: not a chain")
                    _require(key == self._block(child, child.first), f"{below}: wrong key")
                    end = run.last * width
                    _require(child.source[:end] == run.source[:end], f"{below}: off the path")
                    _require(
                        run.parent is None or run.tier is _VRAM or child.tier is _DRAM,
                        f"{below}: a VRAM block under a DRAM block",
                    )
                    vram += child.tier is _VRAM
                    held[child.tier] += child.last - child.first + 1
                    if self._candidate(child, child.tier):
                        _require(
                            (child.tier, id(child)) in live,
                            f"{below}: a frontier block without a live queue entry",
                        )
                counts = f"{at}: counts {run.vram_children} VRAM children, has {vram}"
                _require(run.vram_children == vram, counts)
        _require(held == self.used, f"blocks held {held}, counted as used {self.used}")

    def held(self) -> Iterator[PrefixChange]:
        """The whole state as ADMIT changes: every held prefix at a registration length,
        in its tier (for a worker that must tell the index everything again)."""
        registered, width = self._registered_depths, self._width
        for namespace, root in self._roots.items():
            for run, depth in _blocks(root):
                if depth in registered:
                    tokens = np.frombuffer(run.source[: depth * width], dtype=_TOKEN)
                    length = (depth * self.block_size,)
                    yield PrefixChange(namespace, EventKind.ADMIT, run.tier, tokens, length)

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
        """Evict everything, reporting every held registration length (deepest first)."""
        self._walked = None
        registered = self._registered_depths
        for root in list(self._roots.values()):
            for run, depth in reversed(list(_blocks(root))):
                if depth and depth in registered:
                    self._emit_at(run.namespace, EventKind.EVICT, Tier.ABSENT, run.source, depth)
        self._roots.clear()
        self.used = dict.fromkeys(self.used, 0)
        for heap in self._heaps.values():
            heap.clear()
        self._next = dict.fromkeys(self._next)

    # -- internals: the tree ----------------------------------------------------------

    def _walk(self, namespace: Namespace, data: bytes) -> list[tuple[_Run, int]]:
        """The held runs of the prompt ``data``, root first, each with the depth the
        prompt matches to (below the last run's ``last`` when it parts inside it)."""
        path: list[tuple[_Run, int]] = []
        run = self._roots.get(namespace)
        if run is None:
            return path
        width = self._width
        whole = len(data) // width
        depth = 0
        while depth < whole:
            start = depth * width
            child = run.children.get(data[start : start + width])
            if child is None:
                break
            end = child.last if child.last <= whole else whole
            start += width  # its first block matched as the key
            if end > depth + 1 and data[start : end * width] != child.source[start : end * width]:
                end = self._agreed(data, child.source, depth + 1, end)
            path.append((child, end))
            if end < child.last:
                break
            run, depth = child, end
        return path

    def _agreed(self, data: bytes, source: bytes, good: int, bad: int) -> int:
        """The depth to which ``data`` and ``source`` agree, knowing they do to depth
        ``good`` and not to ``bad``: a binary search of bytes comparisons."""
        width = self._width
        while bad - good > 1:
            mid = (good + bad) // 2
            if data[good * width : mid * width] == source[good * width : mid * width]:
                good = mid
            else:
                bad = mid
        return good

    def _summary(self, path: list[tuple[_Run, int]]) -> CacheMatch:
        # A path's DRAM blocks are its tail (a DRAM block's children are DRAM blocks).
        if not path:
            return CacheMatch()
        dram = 0
        for run, end in reversed(path):
            if run.tier is not _DRAM:
                break
            dram += end - run.first + 1
        return CacheMatch(path[-1][1] * self.block_size, dram * self.block_size)

    def _block(self, run: _Run, depth: int) -> bytes:
        """The token bytes of block ``depth`` of ``run``: its key among its siblings."""
        width = self._width
        return run.source[(depth - 1) * width : depth * width]

    def _split(self, run: _Run, depth: int) -> _Run:
        """Make ``run``'s blocks up to ``depth`` a run of their own (returned), the
        parent of what is left of ``run``, which keeps its last block and entries."""
        parent = run.parent
        assert parent is not None, "a root is never split"
        head = _Run(
            run.namespace,
            parent,
            run.source,
            run.first,
            depth,
            run.tier,
            run.base,
            run.uses,
            run.pin,
            next(self._versions),
        )
        parent.children[self._block(run, run.first)] = head  # in place: sibling order kept
        head.children[self._block(run, depth + 1)] = run
        head.vram_children = run.tier is _VRAM
        run.parent = head
        run.first = depth + 1
        return head

    def _root(self, namespace: Namespace) -> _Run:
        root = self._roots.get(namespace)
        if root is None:
            version = next(self._versions)
            root = self._roots[namespace] = _Run(
                namespace, None, b"", 0, 0, _VRAM, 0, 0, 0, version
            )
        return root

    # -- internals: holding a prompt ----------------------------------------------------

    def _hold(self, namespace: Namespace, tokens: TokenIds, tier: Tier) -> CacheMatch:
        data = _as_bytes(tokens)
        width = self._width
        walked, self._walked = self._walked, None  # holding changes the cache
        if walked is not None and walked[1] == data and walked[0] == namespace:
            path = walked[2]
        else:
            path = self._walk(namespace, data)
        before = self._summary(path)
        held = path[-1][1] if path else 0
        n_blocks = min(len(data) // width, self.capacity[tier])
        self._op += 1
        op = self._op
        base = next(self._ticks) * self._depth_scale  # a block's LRU key this tick: base - depth
        vram = tier is _VRAM
        # The run holding the last block touched so far (the root before the first).
        tail = self._roots.get(namespace)
        promoted: tuple[int, int] | None = None  # depths of the first and last promoted
        for run, end in path:
            if run.first > n_blocks:
                break
            end = min(end, n_blocks)
            if vram and run.tier is _DRAM:
                assert tail is not None, "a held block has a root"
                promoted = (promoted[0] if promoted else run.first, end)
                tail = self._promote(run, end, tail, op, base)
                continue
            if end < run.last:
                run = self._split(run, end)
            self._touch(run, op, base)
            tail = run
        admitted: tuple[int, int] | None = None  # depths of the first and last new block
        if n_blocks > held:
            parent = tail or self._root(namespace)
            admitted = self._admit(namespace, data, parent, held, n_blocks, tier, op, base)
        if promoted:
            self._report(namespace, EventKind.TIER, _VRAM, data, promoted)
        if admitted:
            self._report(namespace, EventKind.ADMIT, tier, data, admitted)
        return before

    def _touch(self, run: _Run, op: int, base: int) -> None:
        """Record a use of every block of ``run`` (pinning them for operation ``op``)."""
        run.pin = op
        run.uses += 1
        if not self._fifo:  # FIFO orders by admission, which a use does not renew
            run.base = base
        run.version = next(self._versions)
        if not (run.vram_children if run.tier is _VRAM else run.children):
            self._queue(run)

    def _promote(self, run: _Run, end: int, tail: _Run, op: int, base: int) -> _Run:
        """Promote the DRAM ``run``'s blocks up to depth ``end`` to VRAM, recording their
        use; ``tail`` holds the parent of the first. Returns the run now holding them.

        Room is made for all of them before they move, as if each made its own: the
        blocks and their parent are pinned, so no victim search sees them, and the
        demoted blocks take the DRAM slots the promoted ones free, so nothing is
        evicted. Room can always be made: a prompt holds at most VRAM-many blocks, so
        while VRAM is full some VRAM block is off its path, and below it an unpinned
        frontier block."""
        used, capacity = self.used, self.capacity
        count = end - run.first + 1
        used[_DRAM] -= count
        short = count - (capacity[_VRAM] - used[_VRAM])
        if short > 0:
            made = self._make_room(_VRAM, short)
            assert made == short, "an unpinned VRAM block can always be demoted"
        used[_VRAM] += count
        uses = run.uses + 1
        if tail.parent is not None and tail.uses == uses and len(tail.children) == 1:
            # They join the touched run they hang from: that run is in VRAM and pinned
            # by this operation, as they now are, and used as often, so (as in
            # _demote_last) it has the same base.
            tail.last = end
            tail.source = run.source
            if run.last == end:  # the whole run moves
                tail.children = run.children
                for child in tail.children.values():
                    child.parent = tail
                run.parent = None
            else:
                run.first = end + 1
                tail.children = {self._block(run, end + 1): run}
        else:
            holder = run if run.last == end else self._split(run, end)
            holder.tier = _VRAM
            tail.vram_children += 1
            holder.uses = uses
            if not self._fifo:
                holder.base = base
            holder.pin = op
            tail = holder
        tail.version = next(self._versions)
        self._queue(tail)  # a frontier block: its children are all in DRAM
        return tail

    def _admit(
        self,
        namespace: Namespace,
        data: bytes,
        parent: _Run,
        depth: int,
        n_blocks: int,
        tier: Tier,
        op: int,
        base: int,
    ) -> tuple[int, int] | None:
        """Hold blocks ``depth + 1..n_blocks`` of ``data`` in ``tier`` as one new run
        under ``parent``, as many as room can be made for; their first and last depth.
        Room is made at once for the blocks that do not fit, in the victim order attaching
        them one by one would give: the blocks are pinned, so no victim search sees
        them."""
        used = self.used
        last = min(n_blocks, depth + self.capacity[tier] - used[tier])  # what fits now
        if last < n_blocks:
            last += self._make_room(tier, n_blocks - last)
        used[tier] += last - depth
        if last == depth:
            return None
        run = _Run(
            namespace, parent, data, depth + 1, last, tier, base, 1, op, next(self._versions)
        )
        width = self._width
        parent.children[data[depth * width : (depth + 1) * width]] = run
        parent.vram_children += tier is _VRAM
        self._queue(run)  # its last block is a frontier block
        return depth + 1, last

    # -- internals: making room ---------------------------------------------------------

    def _make_room(self, tier: Tier, wanted: int) -> int:
        """Free ``wanted`` blocks of the full ``tier``, one at a time in victim order;
        how many were freed (fewer when nothing more may leave)."""
        if tier is _DRAM or not self.capacity[_DRAM]:
            return self._evict(tier, wanted)
        # Demote VRAM's victims to DRAM, evicting DRAM's for them. A victim stays in its
        # VRAM run while DRAM makes room, where no DRAM victim search can take it.
        used, dram_blocks = self.used, self.capacity[_DRAM]
        made = 0
        run = leaf = None  # the runs whose last blocks leave next, not queued meanwhile
        while made < wanted:
            if run is None:
                run = self._victim(_VRAM)
                if run is None:
                    break
            streamed = self._stream_down(run, leaf, wanted - made)
            if streamed:
                made += streamed
                continue
            used[_VRAM] -= 1
            if used[_DRAM] >= dram_blocks:
                if leaf is None or not self._ahead_of_queue(leaf):
                    if leaf is not None:
                        self._queue_next(leaf)
                    leaf = self._victim(_DRAM)
                    if leaf is None:
                        used[_VRAM] += 1
                        self._queue(run)  # still a frontier block: it was a victim
                        return made
                if not self._remove_last(leaf):
                    leaf = None
            used[_DRAM] += 1
            made += 1
            if not self._demote_last(run):
                run = None
        for rest in (run, leaf):
            if rest is not None:
                self._queue_next(rest)
        return made

    def _stream_down(self, run: _Run, leaf: _Run | None, limit: int) -> int:
        """Up to ``limit`` steps of :meth:`_make_room`'s loop at once, where each would
        only move a boundary by one block; how many were taken (0: take one step the
        long way).

        The steady state of a full worker: ``run``'s last VRAM block joins the DRAM run
        below it (same uses, so the same state) and, once DRAM is full, ``leaf``'s last
        block is evicted for it, step after step. No such step queues anything or
        changes another run, so ``run`` stays VRAM's victim and ``leaf`` DRAM's while
        its key stays ahead of the queue. ``s`` such steps come to: ``run`` ends ``s``
        blocks shallower and the run below starts there, ``leaf`` (if DRAM is full)
        ends one block shallower per eviction, and the changes at registered depths
        are reported in the loop's order (each step's eviction before its demotion),
        consecutive changes of one kind as one report: the index applies a report's
        keys in any order, and only one key's own changes must keep theirs.
        A step that would empty either run, or take a new victim, goes the long way.
        """
        if len(run.children) != 1:
            return 0
        (below,) = run.children.values()
        if below.tier is not _DRAM or below.uses != run.uses:
            return 0
        top = run.last
        steps = min(limit, top - run.first)  # run keeps its first block
        free = self.capacity[_DRAM] - self.used[_DRAM]
        if steps > free:
            evictions = 0 if leaf is None else self._evictable(leaf)
            steps = min(steps, max(free, 0) + evictions)
        if steps <= 0:
            return 0
        first_eviction = max(free, 0)
        evicted = max(0, steps - first_eviction)
        end = leaf.last if leaf is not None else 0
        # Step s demotes depth top - s and, from step first_eviction on, first evicts
        # depth end - (s - first_eviction). Only registered depths report, so they are
        # picked out of the sorted registrations (a stream is ~60 blocks, a few of them
        # registered), and consecutive changes of one kind are one report.
        demoted = (top - steps + 1, top)
        if leaf is None or not evicted:
            self._report(run.namespace, EventKind.TIER, _DRAM, run.source, demoted)
        else:
            registered = self._registered
            # (step, demotion after eviction, depth), sorted into the loop's order.
            changes = [(top - depth, 1, depth) for depth in registered[self._between(demoted)]]
            gone = self._between((end - evicted + 1, end))
            changes += [(first_eviction + end - depth, 0, depth) for depth in registered[gone]]
            changes.sort()
            for demotion, group in itertools.groupby(changes, key=operator.itemgetter(1)):
                depths = [depth for _, _, depth in group]  # one kind's, deepest first
                span = (depths[-1], depths[0])
                if demotion:
                    self._report(run.namespace, EventKind.TIER, _DRAM, run.source, span)
                else:
                    self._report(leaf.namespace, EventKind.EVICT, Tier.ABSENT, leaf.source, span)
        new_top = top - steps
        below.first = new_top + 1
        run.children = {self._block(run, new_top + 1): below}
        run.last = new_top
        run.version = next(self._versions)
        if leaf is not None and evicted:
            leaf.last = end - evicted
            leaf.version = next(self._versions)
        self.used[_VRAM] -= steps
        self.used[_DRAM] += steps - evicted
        return steps

    def _evictable(self, leaf: _Run) -> int:
        """How many of ``leaf``'s blocks :meth:`_make_room` would evict one after the
        other without taking another victim: while ``leaf`` keeps a block and its key
        (which grows by one per evicted block) stays ahead of its tier's queue."""
        count = leaf.last - leaf.first
        key = self._key(leaf)
        heap, beside = self._heaps[_DRAM], self._next[_DRAM]
        for entry in (heap[0] if heap else None, beside):
            if entry is not None:
                count = min(count, _steps_below(key, entry[0]))
        return count

    def _demote_last(self, run: _Run) -> bool:
        """Move ``run``'s last block (a VRAM frontier block) to DRAM. It joins its DRAM
        child's run when that has its state (a demotion streaming up a run), else it
        becomes a DRAM run of its own. Whether ``run`` keeps VRAM blocks: its new last
        block is then VRAM's next victim (no other block's key lies between two depths
        of one run) and is not queued here."""
        parent = run.parent
        assert parent is not None, "a victim is held"
        depth = run.last
        below: _Run | None = None
        if len(run.children) == 1:
            (child,) = run.children.values()
            # A child used as often as its parent has the same state: every use of a
            # block uses its parent, so both were admitted and used by the same
            # operations (the same base and pin).
            if child.tier is _DRAM and child.uses == run.uses:
                below = child
        if run.first == depth:  # the whole run leaves VRAM
            if below is not None:
                below.first = depth
                below.parent = parent
                parent.children[self._block(run, depth)] = below  # in place
                run.parent = None
                moved = below
            else:
                run.tier = _DRAM
                run.version = next(self._versions)
                moved = run
            parent.vram_children -= 1
            if parent.parent is not None and not parent.vram_children:
                # It lost its last VRAM child (a VRAM block's parent is a VRAM block).
                self._queue_next(parent)
            kept = False
        else:
            if below is not None:
                below.first = depth
                moved = below
            else:
                moved = _Run(
                    run.namespace,
                    run,
                    run.source,
                    depth,
                    depth,
                    _DRAM,
                    run.base,
                    run.uses,
                    run.pin,
                    next(self._versions),
                )
                moved.children = run.children
                for child in moved.children.values():
                    child.parent = moved
            run.children = {self._block(run, depth): moved}
            run.vram_children = 0
            run.last = depth - 1
            run.version = next(self._versions)
            kept = True
        if moved.last == depth and not moved.children:  # a DRAM frontier block
            self._push(_DRAM, (self._key(moved), moved.version, moved))
        if depth in self._registered_depths:
            self._emit_at(run.namespace, EventKind.TIER, _DRAM, run.source, depth)
        return kept

    def _evict(self, tier: Tier, wanted: int) -> int:
        """Remove ``wanted`` blocks of ``tier`` in victim order; how many were removed
        (fewer when nothing more may leave)."""
        made = 0
        run = None  # the run whose last block leaves next, not queued meanwhile
        while made < wanted:
            if run is None:
                run = self._victim(tier)
                if run is None:
                    break
            made += 1
            if not self._remove_last(run):
                run = None
        if run is not None:
            self._queue_next(run)
        return made

    def _remove_last(self, run: _Run) -> bool:
        """Remove ``run``'s last block, a leaf. Whether ``run`` keeps blocks: its new
        last block is then a frontier block, not queued here; unless a block of the tier
        became a frontier block meanwhile (a demotion's), it is the tier's next victim,
        as no other block's key lies between two depths of one run."""
        assert not run.children, "only leaves leave the cache"
        depth = run.last
        tier = run.tier
        self.used[tier] -= 1
        source = run.source
        if run.first == depth:
            parent = run.parent
            assert parent is not None, "the root is never removed"
            del parent.children[self._block(run, depth)]
            if tier is _VRAM:
                parent.vram_children -= 1
            run.parent = None  # marks it gone for the heaps
            # A root stays, even empty: a prompt may be growing under it.
            if parent.parent is not None and not (
                parent.children if parent.tier is _DRAM else parent.vram_children
            ):
                self._queue_next(parent)
            kept = False
        else:
            run.last = depth - 1
            run.version = next(self._versions)
            kept = True
        if depth in self._registered_depths:
            self._emit_at(run.namespace, EventKind.EVICT, Tier.ABSENT, source, depth)
        return kept

    def _ahead_of_queue(self, run: _Run) -> bool:
        """Whether ``run``'s last block comes before every entry of its tier's queue
        (stale entries included, so a False may be wrong but a True is not)."""
        key = self._key(run)
        heap, beside = self._heaps[run.tier], self._next[run.tier]
        return (not heap or key < heap[0][0]) and (beside is None or key < beside[0])

    # -- internals: the victim heaps ----------------------------------------------------

    def _key(self, run: _Run) -> Any:
        key = run.base - run.last
        return (run.uses, key) if self._lfu else key

    def _candidate(self, run: _Run, tier: Tier) -> bool:
        """Whether ``run``'s last block is a frontier block of ``tier``."""
        if run.parent is None or run.tier is not tier:
            return False
        return not run.children if tier is _DRAM else not run.vram_children

    def _queue(self, run: _Run) -> None:
        """Queue ``run``'s last block, a frontier block, as a victim of its tier."""
        self._push(run.tier, (self._key(run), run.version, run))

    def _push(self, tier: Tier, entry: _Entry) -> None:
        heap = self._heaps[tier]
        heapq.heappush(heap, entry)
        if len(heap) > self._heap_limit[tier]:
            self._rebuild(tier)

    def _queue_next(self, run: _Run) -> None:
        """Queue ``run``'s last block, a frontier block likely its tier's next victim,
        beside the heap: the block a demotion or removal has just bared. LRU and FIFO
        empty a tier a path at a time, bottom up, so the next victim search takes it
        from there without a push and a pop; the one it displaces goes into the heap."""
        tier = run.tier
        displaced = self._next[tier]
        self._next[tier] = (self._key(run), run.version, run)
        if displaced is not None:
            self._push(tier, displaced)

    def _rebuild(self, tier: Tier) -> None:
        """Drop the heap's stale entries; it changes no victim. Every frontier block
        has a live entry: it was queued when it last became one or changed order (the
        one way back to the frontier without a queueing, a promotion that fails after a
        victim search dropped the parent's entry, never happens: see _promote)."""
        self.rebuilds += 1
        heap = self._heaps[tier]  # in place: callers may hold the list
        heap[:] = [
            (self._key(run), run.version, run)
            for root in self._roots.values()
            for run in _runs(root)
            if self._candidate(run, tier)
        ]
        heapq.heapify(heap)
        self._next[tier] = None

    def _victim(self, tier: Tier) -> _Run | None:
        """The run whose last block is the first unpinned frontier block of ``tier`` (by
        key), its entry taken out of the heap or from beside it; None when every
        frontier block is pinned."""
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
            run = entry[2]
            if (
                entry[1] != run.version
                or run.parent is None
                or run.tier is not tier
                or (run.children if dram else run.vram_children)
            ):
                continue  # stale: superseded by a later entry or no longer a frontier
            if run.pin == op:
                pinned.append(entry)
                continue
            victim = run
            break
        self._next[tier] = beside
        for entry in pinned:
            heapq.heappush(heap, entry)
        return victim

    # -- internals: reporting -------------------------------------------------------------

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
        lengths = self._registered_lengths[self._between(span)]
        if lengths:
            tokens = np.frombuffer(prompt[: lengths[-1] * _TOKEN.itemsize], dtype=_TOKEN)
            self._emit(namespace, kind, tier, tokens, lengths)

    def _between(self, span: tuple[int, int]) -> slice:
        """Where the registered depths within ``span`` (first, last) lie in
        ``_registered`` (and their lengths in ``_registered_lengths``)."""
        first, last = span
        registered = self._registered
        return slice(bisect.bisect_left(registered, first), bisect.bisect_right(registered, last))

    def _emit_at(
        self, namespace: Namespace, kind: EventKind, tier: Tier, source: bytes, depth: int
    ) -> None:
        """One change at one registration length: the prefix of ``source`` (a prompt that
        holds the path) that ends with block ``depth``."""
        tokens = np.frombuffer(source[: depth * self._width], dtype=_TOKEN)
        self._emit(namespace, kind, tier, tokens, (depth * self.block_size,))

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


def _steps_below(key: Any, bound: Any) -> int:
    """How many of ``key``, ``key`` + 1, ... are below ``bound`` (eviction keys: ints,
    or LFU's (uses, int) pairs, whose int part grows)."""
    if isinstance(key, tuple):
        if key[0] != bound[0]:
            return 0 if key[0] > bound[0] else 1 << 62
        key, bound = key[1], bound[1]
    return max(0, int(bound) - int(key))


def _require(condition: bool, broken: str) -> None:
    if not condition:
        raise InvariantBroken(f"prefix cache: {broken}")


def _runs(root: _Run) -> Iterator[_Run]:
    """``root`` and the runs below it, parents before children (the last child first)."""
    stack = [root]
    while stack:
        run = stack.pop()
        yield run
        stack.extend(run.children.values())


def _blocks(root: _Run) -> Iterator[tuple[_Run, int]]:
    """Every block under ``root`` (and the root, depth 0) as (its run, its depth), in
    the order of a walk that visits a block's children last child first."""
    for run in _runs(root):
        for depth in range(run.first, run.last + 1):
            yield run, depth


def _as_bytes(tokens: TokenIds) -> bytes:
    return np.ascontiguousarray(tokens, dtype=_TOKEN).tobytes()
