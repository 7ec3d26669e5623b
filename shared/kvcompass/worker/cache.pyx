# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False, cdivision=True
# distutils: extra_compile_args = -O2
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

Compiled (Cython): every worker of a simulation serves each of its prompts through here,
and a full worker demotes and evicts blocks on every admission. Runs are C structs with
object fields, each tier's victim queue a C heap; the tree's children stay dicts keyed
by a block's bytes. The values it takes and returns are plain Python
(:mod:`kvcompass.worker.cache_values`); the signatures are in ``cache.pyi``.
"""

cimport cython
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release
from cpython.buffer cimport PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp

from kvcompass.ndarrays cimport array_over
from kvcompass.unsigned_items cimport holds_uint32

import numpy as np

from kvcompass.errors import InvariantBroken
from kvcompass.frozen_init import field_builder
from kvcompass.index.layout import Tier
from kvcompass.levels import plan_levels
from kvcompass.wire import EventKind
from kvcompass.worker.cache_values import CacheMatch, EvictionPolicy, OnChange, PrefixChange

__all__ = ["CacheMatch", "EvictionPolicy", "OnChange", "PrefixCache", "PrefixChange"]

cdef object _TOKEN = np.dtype("<u4")
cdef Py_ssize_t _TOKEN_BYTES = 4

# Tiers as the C code keeps them: Tier's values.
cdef enum:
    ABSENT = 0
    VRAM = 1
    DRAM = 2

cdef tuple _TIERS = (Tier.ABSENT, Tier.VRAM, Tier.DRAM)
cdef object _ADMIT = EventKind.ADMIT
cdef object _TIER = EventKind.TIER
cdef object _EVICT = EventKind.EVICT
cdef object _NOTHING = CacheMatch()
# The values below are built valid here: made without the type call and __init__.
cdef object _new_match = field_builder(CacheMatch)
cdef object _new_change = field_builder(PrefixChange)

# _steps_below's answer when a key's LFU use count is below the bound's: no limit.
cdef int64_t _UNBOUNDED = 1LL << 62
# A tick's keys are tick * depth_scale - depth: they must stay below 2^63.
cdef int64_t _KEY_LIMIT = 1LL << 62


@cython.final
cdef class _Run:
    """The blocks at depths ``first..last`` of one path, in one state.

    Every block of a run has the same tier, use count, eviction base (a block's key is
    derived from ``base - depth``) and pin, and each but the last has exactly one child,
    the next block of the run. So a run's last block is the only one that can be a
    frontier block, and a prompt walks a run with one bytes comparison instead of a
    lookup per block. A root is a run of no blocks (depth 0).
    """

    cdef public object namespace
    cdef public _Run parent  # None for a root and for a removed run
    # A prompt that starts with the run's whole path: block d is its slice
    # [(d - 1) * width, d * width). A reference, not a copy; it keeps that prompt's
    # bytes alive while the run is held.
    cdef public bytes source
    cdef public Py_ssize_t first
    cdef public Py_ssize_t last
    cdef public dict children  # the last block's, by their first block
    cdef public int tier
    cdef public int64_t base
    cdef public int64_t uses
    cdef public int64_t pin  # the operation that pinned it
    cdef public int64_t version  # renewed whenever the last block's key or tier changes
    cdef public Py_ssize_t vram_children  # VRAM runs among ``children``

    def __init__(
        self, namespace, parent, bytes source, Py_ssize_t first, Py_ssize_t last,
        int tier, int64_t base, int64_t uses, int64_t pin, int64_t version,
    ):
        _fill(self, namespace, parent, source, first, last, tier, base, uses, pin, version)


cdef inline _Run _new_run(
    object namespace, _Run parent, bytes source, Py_ssize_t first, Py_ssize_t last,
    int tier, int64_t base, int64_t uses, int64_t pin, int64_t version,
):
    """A run made from C (its __init__ parses Python arguments)."""
    cdef _Run run = _Run.__new__(_Run)
    _fill(run, namespace, parent, source, first, last, tier, base, uses, pin, version)
    return run


cdef inline void _fill(
    _Run run, object namespace, _Run parent, bytes source, Py_ssize_t first,
    Py_ssize_t last, int tier, int64_t base, int64_t uses, int64_t pin, int64_t version,
) noexcept:
    run.namespace = namespace
    run.parent = parent
    run.source = source
    run.first = first
    run.last = last
    run.children = {}
    run.tier = tier
    run.base = base
    run.uses = uses
    run.pin = pin
    run.version = version
    run.vram_children = 0


cdef _Run _only_child(dict children):
    """The one run of a dict of one child."""
    cdef Py_ssize_t at = 0
    cdef PyObject* key
    cdef PyObject* value
    PyDict_Next(children, &at, &key, &value)
    return <_Run>value


# -- the victim queues ---------------------------------------------------------------

cdef struct Entry:
    # A frontier block's place in its tier's victim order: (uses, key, version), compared
    # in that order. ``uses`` is LFU's first key (0 under LRU and FIFO); ``key`` encodes
    # the rest of the policy's order; ``version`` is the run's when it was queued.
    int64_t uses
    int64_t key
    int64_t version
    PyObject* run  # a reference the entry owns


cdef inline bint _before(const Entry* a, const Entry* b) noexcept nogil:
    if a.uses != b.uses:
        return a.uses < b.uses
    if a.key != b.key:
        return a.key < b.key
    return a.version < b.version


cdef inline bint _key_before(const Entry* a, const Entry* b) noexcept nogil:
    """Whether ``a``'s key (uses, key) comes before ``b``'s."""
    if a.uses != b.uses:
        return a.uses < b.uses
    return a.key < b.key


cdef inline int64_t _steps_below(const Entry* key, const Entry* bound) noexcept nogil:
    """How many of ``key``, ``key`` + 1, ... are below ``bound`` (an LFU key's use count
    first, then the part that grows)."""
    if key.uses != bound.uses:
        return 0 if key.uses > bound.uses else _UNBOUNDED
    return bound.key - key.key if bound.key > key.key else 0


@cython.final
cdef class _VictimQueue:
    """One tier's frontier blocks: a binary min-heap of entries, and one entry beside it
    (:meth:`PrefixCache._queue_next`). Entries own a reference to their run."""

    cdef Entry* heap
    cdef Py_ssize_t size
    cdef Py_ssize_t allocated
    cdef Entry beside
    cdef bint has_beside
    cdef Py_ssize_t limit  # rebuilt from the tree when stale entries make it this long

    def __cinit__(self, Py_ssize_t limit):
        self.limit = limit
        self.allocated = 64
        self.heap = <Entry*>malloc(self.allocated * sizeof(Entry))
        if self.heap is NULL:
            raise MemoryError()

    def __dealloc__(self):
        self.clear()
        free(self.heap)

    cdef void clear(self) noexcept:
        cdef Py_ssize_t i
        for i in range(self.size):
            Py_DECREF(<object>self.heap[i].run)
        self.size = 0
        self.drop_beside()

    cdef void drop_beside(self) noexcept:
        if self.has_beside:
            self.has_beside = False
            Py_DECREF(<object>self.beside.run)

    cdef int push(self, Entry entry) except -1:
        """Add ``entry`` (its reference passes to the heap)."""
        cdef Entry* grown
        cdef Py_ssize_t at, up
        if self.size == self.allocated:
            grown = <Entry*>realloc(self.heap, 2 * self.allocated * sizeof(Entry))
            if grown is NULL:
                Py_DECREF(<object>entry.run)
                raise MemoryError()
            self.heap = grown
            self.allocated *= 2
        at = self.size
        self.size += 1
        while at > 0:
            up = (at - 1) >> 1
            if not _before(&entry, &self.heap[up]):
                break
            self.heap[at] = self.heap[up]
            at = up
        self.heap[at] = entry
        return 0

    cdef Entry pop(self) noexcept:
        """Take the first entry out (its reference passes to the caller); not empty."""
        cdef Entry first = self.heap[0]
        self.size -= 1
        if self.size:
            self.sift_down(0, self.heap[self.size])
        return first

    cdef void heapify(self) noexcept:
        cdef Py_ssize_t start
        for start in range(self.size // 2 - 1, -1, -1):
            self.sift_down(start, self.heap[start])

    cdef void sift_down(self, Py_ssize_t at, Entry moved) noexcept:
        """Put ``moved`` at ``at`` or below, wherever the heap order wants it."""
        cdef Py_ssize_t child
        while True:
            child = 2 * at + 1
            if child >= self.size:
                break
            if child + 1 < self.size and _before(&self.heap[child + 1], &self.heap[child]):
                child += 1
            if not _before(&self.heap[child], &moved):
                break
            self.heap[at] = self.heap[child]
            at = child
        self.heap[at] = moved


cdef class PrefixCache:
    """Blocks of cached prompts in VRAM and DRAM; see the module docstring.

    ``registration_lengths`` are the lengths the worker registers at (block multiples);
    ``on_change`` receives every change at them, in the order they happen.

    The tree is kept as runs (:class:`_Run`): a prompt's new blocks are one run, and a
    run is split only where its blocks' states part (a later prompt uses, promotes or
    branches off part of it) and grows when a neighbour's block takes its state (a
    demotion or promotion streaming through a run). Each tier's frontier blocks wait in
    a heap of (key, version, run) entries for the run's last block, pushed whenever one
    may have become a frontier block or its order changed and checked when popped (an
    entry whose version is old, or whose run's last block is no longer a frontier
    block of that tier, is dropped). ``key`` encodes the policy's order: LRU
    ``(last use, -depth)`` is ``last_use * depth_scale - depth`` (every depth is below
    ``depth_scale``), FIFO the same with the admission tick, LFU ``(uses, that)``. Two
    blocks never share a key (one path is touched per tick), so the order is total;
    versions come from one counter, so two entries alike in key and version are the
    same run's.
    """

    cdef readonly Py_ssize_t block_size
    cdef readonly object policy
    #: Victim queues rebuilt from the tree so far (the rare path that drops stale
    #: entries; it changes no victim).
    cdef readonly Py_ssize_t rebuilds
    #: Prompts walked through the tree so far (a use right after its match walks none).
    cdef readonly Py_ssize_t walks
    cdef readonly dict _roots
    cdef Py_ssize_t _capacity[3]
    cdef Py_ssize_t _used[3]
    cdef _VictimQueue _vram_queue
    cdef _VictimQueue _dram_queue
    cdef bint _lfu
    cdef bint _fifo
    # The registration depths, ascending, and their lengths in tokens (a change's
    # lengths are a slice of them); which depths are registered, by depth.
    cdef Py_ssize_t* _registered
    cdef Py_ssize_t _n_registered
    cdef tuple _registered_lengths
    cdef unsigned char* _is_registered
    cdef Py_ssize_t _deepest_registered
    cdef Py_ssize_t _width
    cdef object _on_change
    cdef int64_t _depth_scale
    cdef int64_t _tick
    cdef int64_t _version
    cdef int64_t _op
    # The last match's walk (namespace, prompt bytes, path), until the cache changes.
    cdef object _walked_namespace
    cdef bytes _walked_data
    cdef list _walked_path

    def __init__(
        self,
        Py_ssize_t block_size,
        Py_ssize_t vram_blocks,
        Py_ssize_t dram_blocks,
        registration_lengths,
        policy=EvictionPolicy.LRU,
        on_change=None,
    ):
        if block_size < 1 or vram_blocks < 1 or dram_blocks < 0:
            raise ValueError("block_size and vram_blocks must be positive, dram_blocks >= 0")
        lengths = list(registration_lengths)
        if any(c % block_size for c in lengths):
            raise ValueError(f"registration lengths must be multiples of {block_size}")
        self.block_size = block_size
        self._capacity[VRAM] = vram_blocks
        self._capacity[DRAM] = dram_blocks
        self.policy = EvictionPolicy(policy)
        self._lfu = self.policy is EvictionPolicy.LFU
        self._fifo = self.policy is EvictionPolicy.FIFO
        depths = sorted({c // block_size for c in lengths})
        self._n_registered = len(depths)
        self._deepest_registered = max(depths, default=0)
        self._registered = <Py_ssize_t*>malloc((len(depths) + 1) * sizeof(Py_ssize_t))
        self._is_registered = <unsigned char*>malloc(self._deepest_registered + 1)
        if self._registered is NULL or self._is_registered is NULL:
            raise MemoryError()
        for i in range(self._deepest_registered + 1):
            self._is_registered[i] = 0
        for i, depth in enumerate(depths):
            self._registered[i] = depth
            if depth >= 0:
                self._is_registered[depth] = 1
        self._registered_lengths = tuple(d * block_size for d in depths)
        self._width = block_size * _TOKEN_BYTES
        self._on_change = on_change
        self._roots = {}
        self._vram_queue = _VictimQueue(4 * vram_blocks + 64)
        self._dram_queue = _VictimQueue(4 * dram_blocks + 64)
        self._depth_scale = 1 << (vram_blocks + dram_blocks).bit_length()
        if self._depth_scale > (1 << 40):
            raise ValueError("a cache holds at most 2^40 blocks")

    def __dealloc__(self):
        free(self._registered)
        free(self._is_registered)

    @classmethod
    def for_worker(cls, topology, worker, policy=EvictionPolicy.LRU, on_change=None):
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

    @property
    def capacity(self):
        return {Tier.VRAM: self._capacity[VRAM], Tier.DRAM: self._capacity[DRAM]}

    @property
    def used(self):
        return {Tier.VRAM: self._used[VRAM], Tier.DRAM: self._used[DRAM]}

    # -- reading ---------------------------------------------------------------------

    def match(self, namespace, tokens):
        """The longest held prefix of ``tokens`` (read-only: no use is recorded)."""
        cdef bytes data = _as_bytes(tokens)
        cdef list path = self._walk(namespace, data)
        # An engine matches a prompt as it arrives and, on an idle worker, uses it at
        # once: until the cache changes, that use walks no further.
        self._walked_namespace = namespace
        self._walked_data = data
        self._walked_path = path
        return self._summary(path)

    def blocks(self, tier):
        cdef int t = tier
        if t != VRAM and t != DRAM:
            raise ValueError(f"no blocks are held in tier {tier!r}")
        return self._used[t]

    def check(self):
        """Raise InvariantBroken naming the first broken invariant (tests and debugging;
        it walks the whole cache): every run a chain of blocks right after its parent's
        last block, keyed by its first block, its source starting with its whole path;
        a DRAM block's children DRAM, and each run's count of VRAM children right; the
        blocks held adding up to ``used``; every frontier block with a live entry in its
        tier's victim queue (what keeps a queue's rebuild from changing a victim)."""
        cdef _Run run, child
        cdef Py_ssize_t width = self._width
        live = set()
        for tier in (VRAM, DRAM):
            live.update((tier, id(run)) for run in self._queued(tier))
        held = dict.fromkeys(_TIERS[VRAM:], 0)
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
                        run.parent is None or run.tier == VRAM or child.tier == DRAM,
                        f"{below}: a VRAM block under a DRAM block",
                    )
                    vram += child.tier == VRAM
                    held[_TIERS[child.tier]] += child.last - child.first + 1
                    if self._candidate(child, child.tier):
                        _require(
                            (child.tier, id(child)) in live,
                            f"{below}: a frontier block without a live queue entry",
                        )
                counts = f"{at}: counts {run.vram_children} VRAM children, has {vram}"
                _require(run.vram_children == vram, counts)
        _require(held == self.used, f"blocks held {held}, counted as used {self.used}")

    def held(self):
        """The whole state as ADMIT changes: every held prefix at a registration length,
        in its tier (for a worker that must tell the index everything again)."""
        cdef _Run run
        cdef Py_ssize_t depth
        for namespace, root in self._roots.items():
            for run, depth in _blocks(root):
                if self._registered_at(depth):
                    tokens = _prefix(run.source, depth * self.block_size)
                    length = (depth * self.block_size,)
                    yield _new_change(namespace, _ADMIT, _TIERS[run.tier], tokens, length)

    # -- changing --------------------------------------------------------------------

    def use(self, namespace, tokens):
        """Serve a prompt: returns what was held before (the reuse), then holds every
        full block of it in VRAM (promoting DRAM blocks, admitting new ones) and records
        the use. A prompt longer than VRAM keeps only its first VRAM-full of blocks."""
        return self._hold(namespace, tokens, VRAM)

    def load(self, namespace, tokens):
        """Hold a migrated prefix: new blocks go to DRAM (VRAM when the worker has no
        DRAM); held blocks keep their tier. Returns what was held before."""
        return self._hold(namespace, tokens, DRAM if self._capacity[DRAM] else VRAM)

    def clear(self):
        """Evict everything, reporting every held registration length (deepest first)."""
        cdef _Run run
        cdef Py_ssize_t depth
        self._forget_walk()
        for root in list(self._roots.values()):
            for run, depth in reversed(list(_blocks(root))):
                if depth and self._registered_at(depth):
                    self._emit_at(run.namespace, _EVICT, ABSENT, run.source, depth)
        self._roots.clear()
        self._used[VRAM] = self._used[DRAM] = 0
        self._vram_queue.clear()
        self._dram_queue.clear()

    # -- internals: the tree ----------------------------------------------------------

    cdef inline int64_t _next_version(self) noexcept:
        self._version += 1
        return self._version

    cdef inline bint _registered_at(self, Py_ssize_t depth) noexcept:
        return 0 <= depth <= self._deepest_registered and self._is_registered[depth]

    cdef inline void _forget_walk(self) noexcept:
        self._walked_namespace = None
        self._walked_data = None
        self._walked_path = None

    cdef list _walk(self, object namespace, bytes data):
        """The held runs of the prompt ``data``, root first, each as (run, the depth the
        prompt matches to: below the last run's ``last`` when it parts inside it)."""
        cdef list path = []
        cdef _Run run, child
        cdef Py_ssize_t width = self._width
        cdef Py_ssize_t whole = len(data) // width
        cdef Py_ssize_t depth = 0, start, end
        cdef const char* bytes_ = PyBytes_AS_STRING(data)
        self.walks += 1
        found = self._roots.get(namespace)
        if found is None:
            return path
        run = <_Run>found
        while depth < whole:
            start = depth * width
            found = run.children.get(data[start : start + width])
            if found is None:
                break
            child = <_Run>found
            end = child.last if child.last <= whole else whole
            start += width  # its first block matched as the key
            if end > depth + 1 and memcmp(
                bytes_ + start, PyBytes_AS_STRING(child.source) + start, end * width - start
            ):
                end = self._agreed(data, child.source, depth + 1, end)
            path.append((child, end))
            if end < child.last:
                break
            run, depth = child, end
        return path

    cdef Py_ssize_t _agreed(self, bytes data, bytes source, Py_ssize_t good, Py_ssize_t bad):
        """The depth to which ``data`` and ``source`` agree, knowing they do to depth
        ``good`` and not to ``bad``: a binary search of bytes comparisons."""
        cdef Py_ssize_t width = self._width, mid
        cdef const char* a = PyBytes_AS_STRING(data)
        cdef const char* b = PyBytes_AS_STRING(source)
        while bad - good > 1:
            mid = (good + bad) // 2
            if memcmp(a + good * width, b + good * width, (mid - good) * width) == 0:
                good = mid
            else:
                bad = mid
        return good

    cdef object _summary(self, list path):
        # A path's DRAM blocks are its tail (a DRAM block's children are DRAM blocks).
        cdef _Run run
        cdef Py_ssize_t end, dram = 0, i
        if not path:
            return _NOTHING
        for i in range(len(path) - 1, -1, -1):
            run, end = path[i]
            if run.tier != DRAM:
                break
            dram += end - run.first + 1
        end = path[len(path) - 1][1]
        return _new_match(end * self.block_size, dram * self.block_size)

    cdef inline bytes _block(self, _Run run, Py_ssize_t depth):
        """The token bytes of block ``depth`` of ``run``: its key among its siblings."""
        cdef Py_ssize_t width = self._width
        return run.source[(depth - 1) * width : depth * width]

    cdef _Run _split(self, _Run run, Py_ssize_t depth):
        """Make ``run``'s blocks up to ``depth`` a run of their own (returned), the
        parent of what is left of ``run``, which keeps its last block and entries."""
        cdef _Run parent = run.parent
        cdef _Run head = _new_run(
            run.namespace, parent, run.source, run.first, depth, run.tier, run.base,
            run.uses, run.pin, self._next_version(),
        )
        parent.children[self._block(run, run.first)] = head  # in place: sibling order kept
        head.children[self._block(run, depth + 1)] = run
        head.vram_children = run.tier == VRAM
        run.parent = head
        run.first = depth + 1
        return head

    cdef _Run _root(self, object namespace):
        found = self._roots.get(namespace)
        if found is not None:
            return <_Run>found
        cdef _Run root = _new_run(namespace, None, b"", 0, 0, VRAM, 0, 0, 0, self._next_version())
        self._roots[namespace] = root
        return root

    # -- internals: holding a prompt ----------------------------------------------------

    cdef object _hold(self, object namespace, object tokens, int tier):
        cdef bytes data
        cdef Py_ssize_t width = self._width
        cdef list path = None
        cdef _Run run, tail
        cdef Py_ssize_t held, n_blocks, end, first_promoted = 0, last_promoted = 0
        cdef Py_ssize_t first_admitted = 0, last_admitted = 0
        cdef int64_t op, base
        cdef bint vram = tier == VRAM
        if self._walked_path is not None and (
            self._walked_namespace is namespace or self._walked_namespace == namespace
        ):
            # The prompt just matched (an engine's use on an idle worker): compared in
            # place, its bytes and walk are the match's.
            if _holds_bytes(tokens, self._walked_data):
                data = self._walked_data
            else:
                data = _as_bytes(tokens)
            if data is self._walked_data or data == self._walked_data:
                path = self._walked_path
        else:
            data = _as_bytes(tokens)
        if path is None:
            path = self._walk(namespace, data)
        self._forget_walk()  # holding changes the cache
        before = self._summary(path)
        held = path[len(path) - 1][1] if path else 0
        n_blocks = min(len(data) // width, self._capacity[tier])
        self._op += 1
        op = self._op
        self._tick += 1
        if self._tick >= _KEY_LIMIT // self._depth_scale:
            raise OverflowError("the cache's use counter ran out of 63-bit keys")
        base = self._tick * self._depth_scale  # a block's LRU key this tick: base - depth
        # The run holding the last block touched so far (the root before the first).
        found = self._roots.get(namespace)
        tail = None if found is None else <_Run>found
        for run, end in path:
            if run.first > n_blocks:
                break
            end = min(end, n_blocks)
            if vram and run.tier == DRAM:
                if not first_promoted:
                    first_promoted = run.first
                last_promoted = end
                tail = self._promote(run, end, tail, op, base)
                continue
            if end < run.last:
                run = self._split(run, end)
            self._touch(run, op, base)
            tail = run
        if n_blocks > held:
            if tail is None:
                tail = self._root(namespace)
            last_admitted = self._admit(namespace, data, tail, held, n_blocks, tier, op, base)
            if last_admitted:
                first_admitted = held + 1
        if first_promoted:
            self._report(namespace, _TIER, VRAM, data, first_promoted, last_promoted)
        if last_admitted:
            self._report(namespace, _ADMIT, tier, data, first_admitted, last_admitted)
        return before

    cdef int _touch(self, _Run run, int64_t op, int64_t base) except -1:
        """Record a use of every block of ``run`` (pinning them for operation ``op``)."""
        run.pin = op
        run.uses += 1
        if not self._fifo:  # FIFO orders by admission, which a use does not renew
            run.base = base
        run.version = self._next_version()
        if not (run.vram_children if run.tier == VRAM else len(run.children)):
            self._queue(run)
        return 0

    cdef _Run _promote(self, _Run run, Py_ssize_t end, _Run tail, int64_t op, int64_t base):
        """Promote the DRAM ``run``'s blocks up to depth ``end`` to VRAM, recording their
        use; ``tail`` holds the parent of the first. Returns the run now holding them.

        Room is made for all of them before they move, as if each made its own: the
        blocks and their parent are pinned, so no victim search sees them, and the
        demoted blocks take the DRAM slots the promoted ones free, so nothing is
        evicted. Room can always be made: a prompt holds at most VRAM-many blocks, so
        while VRAM is full some VRAM block is off its path, and below it an unpinned
        frontier block."""
        cdef Py_ssize_t count = end - run.first + 1, short, made
        cdef int64_t uses
        cdef _Run holder, child
        self._used[DRAM] -= count
        short = count - (self._capacity[VRAM] - self._used[VRAM])
        if short > 0:
            made = self._make_room(VRAM, short)
            assert made == short, "an unpinned VRAM block can always be demoted"
        self._used[VRAM] += count
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
            holder.tier = VRAM
            tail.vram_children += 1
            holder.uses = uses
            if not self._fifo:
                holder.base = base
            holder.pin = op
            tail = holder
        tail.version = self._next_version()
        self._queue(tail)  # a frontier block: its children are all in DRAM
        return tail

    cdef Py_ssize_t _admit(
        self,
        object namespace,
        bytes data,
        _Run parent,
        Py_ssize_t depth,
        Py_ssize_t n_blocks,
        int tier,
        int64_t op,
        int64_t base,
    ) except -1:
        """Hold blocks ``depth + 1..n_blocks`` of ``data`` in ``tier`` as one new run
        under ``parent``, as many as room can be made for; the last one's depth (0: none).
        Room is made at once for the blocks that do not fit, in the victim order attaching
        them one by one would give: the blocks are pinned, so no victim search sees
        them."""
        cdef Py_ssize_t width = self._width
        cdef Py_ssize_t last = min(n_blocks, depth + self._capacity[tier] - self._used[tier])
        if last < n_blocks:  # what fits now, then what room is made for
            last += self._make_room(tier, n_blocks - last)
        self._used[tier] += last - depth
        if last == depth:
            return 0
        cdef _Run run = _new_run(
            namespace, parent, data, depth + 1, last, tier, base, 1, op, self._next_version()
        )
        parent.children[data[depth * width : (depth + 1) * width]] = run
        parent.vram_children += tier == VRAM
        self._queue(run)  # its last block is a frontier block
        return last

    # -- internals: making room ---------------------------------------------------------

    cdef Py_ssize_t _make_room(self, int tier, Py_ssize_t wanted) except -1:
        """Free ``wanted`` blocks of the full ``tier``, one at a time in victim order;
        how many were freed (fewer when nothing more may leave)."""
        if tier == DRAM or not self._capacity[DRAM]:
            return self._evict(tier, wanted)
        # Demote VRAM's victims to DRAM, evicting DRAM's for them. A victim stays in its
        # VRAM run while DRAM makes room, where no DRAM victim search can take it.
        cdef Py_ssize_t dram_blocks = self._capacity[DRAM], made = 0, streamed
        cdef _Run run = None, leaf = None  # whose last blocks leave next, not queued meanwhile
        while made < wanted:
            if run is None:
                run = self._victim(VRAM)
                if run is None:
                    break
            streamed = self._stream_down(run, leaf, wanted - made)
            if streamed:
                made += streamed
                continue
            self._used[VRAM] -= 1
            if self._used[DRAM] >= dram_blocks:
                if leaf is None or not self._ahead_of_queue(leaf):
                    if leaf is not None:
                        self._queue_next(leaf)
                    leaf = self._victim(DRAM)
                    if leaf is None:
                        self._used[VRAM] += 1
                        self._queue(run)  # still a frontier block: it was a victim
                        return made
                if not self._remove_last(leaf):
                    leaf = None
            self._used[DRAM] += 1
            made += 1
            if not self._demote_last(run):
                run = None
        if run is not None:
            self._queue_next(run)
        if leaf is not None:
            self._queue_next(leaf)
        return made

    cdef Py_ssize_t _stream_down(self, _Run run, _Run leaf, Py_ssize_t limit) except -1:
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
        cdef _Run below
        cdef Py_ssize_t top, steps, free_, evictions, first_eviction, evicted, end, new_top
        if len(run.children) != 1:
            return 0
        below = _only_child(run.children)
        if below.tier != DRAM or below.uses != run.uses:
            return 0
        top = run.last
        steps = min(limit, top - run.first)  # run keeps its first block
        free_ = self._capacity[DRAM] - self._used[DRAM]
        if steps > free_:
            evictions = 0 if leaf is None else self._evictable(leaf)
            steps = min(steps, max(free_, 0) + evictions)
        if steps <= 0:
            return 0
        first_eviction = max(free_, 0)
        evicted = max(0, steps - first_eviction)
        end = leaf.last if leaf is not None else 0
        if leaf is None or not evicted:
            self._report(run.namespace, _TIER, DRAM, run.source, top - steps + 1, top)
        else:
            self._report_streamed(run, leaf, top, steps, first_eviction, end, evicted)
        new_top = top - steps
        below.first = new_top + 1
        run.children = {self._block(run, new_top + 1): below}
        run.last = new_top
        run.version = self._next_version()
        if leaf is not None and evicted:
            leaf.last = end - evicted
            leaf.version = self._next_version()
        self._used[VRAM] -= steps
        self._used[DRAM] += steps - evicted
        return steps

    cdef int _report_streamed(
        self, _Run run, _Run leaf, Py_ssize_t top, Py_ssize_t steps,
        Py_ssize_t first_eviction, Py_ssize_t end, Py_ssize_t evicted,
    ) except -1:
        """The changes of :meth:`_stream_down`'s steps at registered depths, in the
        loop's order. Step s demotes depth top - s and, from step ``first_eviction`` on,
        first evicts depth end - (s - first_eviction): both lists run deepest first, and
        are merged by step (an eviction before the demotion of its step); each stretch
        of one kind is one report, of the depths it spans."""
        cdef Py_ssize_t d_lo, d_at, e_lo, e_at, unused
        cdef Py_ssize_t step_d, step_e, depth, deepest = 0, shallowest = 0
        cdef int kind = -1, taken  # 1: a demotion, 0: an eviction
        self._registered_range(top - steps + 1, top, &d_lo, &d_at)
        self._registered_range(end - evicted + 1, end, &e_lo, &e_at)
        while d_at > d_lo or e_at > e_lo:
            step_d = top - self._registered[d_at - 1] if d_at > d_lo else -1
            step_e = first_eviction + end - self._registered[e_at - 1] if e_at > e_lo else -1
            if step_e >= 0 and (step_d < 0 or step_e <= step_d):
                e_at -= 1
                taken, depth = 0, self._registered[e_at]
            else:
                d_at -= 1
                taken, depth = 1, self._registered[d_at]
            if taken != kind:
                if kind >= 0:
                    self._report_one_kind(run, leaf, kind, shallowest, deepest)
                kind, deepest = taken, depth
            shallowest = depth
        if kind >= 0:
            self._report_one_kind(run, leaf, kind, shallowest, deepest)
        return 0

    cdef int _report_one_kind(
        self, _Run run, _Run leaf, int demotion, Py_ssize_t first, Py_ssize_t last
    ) except -1:
        if demotion:
            self._report(run.namespace, _TIER, DRAM, run.source, first, last)
        else:
            self._report(leaf.namespace, _EVICT, ABSENT, leaf.source, first, last)
        return 0

    cdef int64_t _evictable(self, _Run leaf) except -1:
        """How many of ``leaf``'s blocks :meth:`_make_room` would evict one after the
        other without taking another victim: while ``leaf`` keeps a block and its key
        (which grows by one per evicted block) stays ahead of its tier's queue."""
        cdef int64_t count = leaf.last - leaf.first
        cdef Entry key = self._key_of(leaf)
        cdef _VictimQueue queue = self._dram_queue
        if queue.size:
            count = min(count, _steps_below(&key, &queue.heap[0]))
        if queue.has_beside:
            count = min(count, _steps_below(&key, &queue.beside))
        return count

    cdef bint _demote_last(self, _Run run) except -1:
        """Move ``run``'s last block (a VRAM frontier block) to DRAM. It joins its DRAM
        child's run when that has its state (a demotion streaming up a run), else it
        becomes a DRAM run of its own. Whether ``run`` keeps VRAM blocks: its new last
        block is then VRAM's next victim (no other block's key lies between two depths
        of one run) and is not queued here."""
        cdef _Run parent = run.parent
        cdef _Run below = None, child, moved
        cdef Py_ssize_t depth = run.last
        cdef bint kept
        assert parent is not None, "a victim is held"
        if len(run.children) == 1:
            child = _only_child(run.children)
            # A child used as often as its parent has the same state: every use of a
            # block uses its parent, so both were admitted and used by the same
            # operations (the same base and pin).
            if child.tier == DRAM and child.uses == run.uses:
                below = child
        if run.first == depth:  # the whole run leaves VRAM
            if below is not None:
                below.first = depth
                below.parent = parent
                parent.children[self._block(run, depth)] = below  # in place
                run.parent = None
                moved = below
            else:
                run.tier = DRAM
                run.version = self._next_version()
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
                moved = _new_run(
                    run.namespace, run, run.source, depth, depth, DRAM, run.base, run.uses,
                    run.pin, self._next_version(),
                )
                moved.children = run.children
                for child in moved.children.values():
                    child.parent = moved
            run.children = {self._block(run, depth): moved}
            run.vram_children = 0
            run.last = depth - 1
            run.version = self._next_version()
            kept = True
        if moved.last == depth and not moved.children:  # a DRAM frontier block
            self._push(DRAM, self._entry_of(moved))
        if self._registered_at(depth):
            self._emit_at(run.namespace, _TIER, DRAM, run.source, depth)
        return kept

    cdef Py_ssize_t _evict(self, int tier, Py_ssize_t wanted) except -1:
        """Remove ``wanted`` blocks of ``tier`` in victim order; how many were removed
        (fewer when nothing more may leave)."""
        cdef Py_ssize_t made = 0
        cdef _Run run = None  # the run whose last block leaves next, not queued meanwhile
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

    cdef bint _remove_last(self, _Run run) except -1:
        """Remove ``run``'s last block, a leaf. Whether ``run`` keeps blocks: its new
        last block is then a frontier block, not queued here; unless a block of the tier
        became a frontier block meanwhile (a demotion's), it is the tier's next victim,
        as no other block's key lies between two depths of one run."""
        cdef Py_ssize_t depth = run.last
        cdef int tier = run.tier
        cdef bytes source = run.source
        cdef _Run parent
        cdef bint kept
        assert not run.children, "only leaves leave the cache"
        self._used[tier] -= 1
        if run.first == depth:
            parent = run.parent
            assert parent is not None, "the root is never removed"
            del parent.children[self._block(run, depth)]
            if tier == VRAM:
                parent.vram_children -= 1
            run.parent = None  # marks it gone for the heaps
            # A root stays, even empty: a prompt may be growing under it.
            if parent.parent is not None and not (
                len(parent.children) if parent.tier == DRAM else parent.vram_children
            ):
                self._queue_next(parent)
            kept = False
        else:
            run.last = depth - 1
            run.version = self._next_version()
            kept = True
        if self._registered_at(depth):
            self._emit_at(run.namespace, _EVICT, ABSENT, source, depth)
        return kept

    cdef bint _ahead_of_queue(self, _Run run) except -1:
        """Whether ``run``'s last block comes before every entry of its tier's queue
        (stale entries included, so a False may be wrong but a True is not)."""
        cdef Entry key = self._key_of(run)
        cdef _VictimQueue queue = self._queue_of(run.tier)
        return (not queue.size or _key_before(&key, &queue.heap[0])) and (
            not queue.has_beside or _key_before(&key, &queue.beside)
        )

    # -- internals: the victim queues ---------------------------------------------------

    cdef inline _VictimQueue _queue_of(self, int tier):
        return self._vram_queue if tier == VRAM else self._dram_queue

    cdef inline Entry _key_of(self, _Run run) noexcept:
        """``run``'s last block's place in the victim order, without its run."""
        cdef Entry entry
        entry.uses = run.uses if self._lfu else 0
        entry.key = run.base - run.last
        entry.version = run.version
        entry.run = NULL
        return entry

    cdef inline Entry _entry_of(self, _Run run) noexcept:
        """``run``'s last block's entry, holding a new reference to ``run``."""
        cdef Entry entry = self._key_of(run)
        entry.run = <PyObject*>run
        Py_INCREF(run)
        return entry

    cdef inline bint _candidate(self, _Run run, int tier) noexcept:
        """Whether ``run``'s last block is a frontier block of ``tier``."""
        if run.parent is None or run.tier != tier:
            return False
        return not len(run.children) if tier == DRAM else not run.vram_children

    cdef inline int _queue(self, _Run run) except -1:
        """Queue ``run``'s last block, a frontier block, as a victim of its tier."""
        return self._push(run.tier, self._entry_of(run))

    cdef int _push(self, int tier, Entry entry) except -1:
        cdef _VictimQueue queue = self._queue_of(tier)
        queue.push(entry)
        if queue.size > queue.limit:
            self._rebuild(tier)
        return 0

    cdef int _queue_next(self, _Run run) except -1:
        """Queue ``run``'s last block, a frontier block likely its tier's next victim,
        beside the heap: the block a demotion or removal has just bared. LRU and FIFO
        empty a tier a path at a time, bottom up, so the next victim search takes it
        from there without a push and a pop; the one it displaces goes into the heap."""
        cdef _VictimQueue queue = self._queue_of(run.tier)
        cdef Entry displaced = queue.beside
        cdef bint had = queue.has_beside
        queue.beside = self._entry_of(run)
        queue.has_beside = True
        if had:
            self._push(run.tier, displaced)
        return 0

    cdef int _rebuild(self, int tier) except -1:
        """Drop the heap's stale entries; it changes no victim. Every frontier block
        has a live entry: it was queued when it last became one or changed order (the
        one way back to the frontier without a queueing, a promotion that fails after a
        victim search dropped the parent's entry, never happens: see _promote)."""
        cdef _VictimQueue queue = self._queue_of(tier)
        cdef _Run run
        self.rebuilds += 1
        queue.clear()
        for root in self._roots.values():
            for run in _runs(root):
                if self._candidate(run, tier):
                    queue.push(self._entry_of(run))
        queue.heapify()
        return 0

    cdef _Run _victim(self, int tier):
        """The run whose last block is the first unpinned frontier block of ``tier`` (by
        key), its entry taken out of the heap or from beside it; None when every
        frontier block is pinned."""
        cdef _VictimQueue queue = self._queue_of(tier)
        cdef Entry entry
        cdef Entry beside = queue.beside
        cdef bint has_beside = queue.has_beside
        cdef bint dram = tier == DRAM
        cdef int64_t op = self._op
        cdef _Run run, victim = None
        cdef list pinned = None  # (uses, key, version, run) of the pinned entries
        queue.has_beside = False
        while True:
            if has_beside and (not queue.size or _before(&beside, &queue.heap[0])):
                entry = beside
                has_beside = False
            elif queue.size:
                entry = queue.pop()
            else:
                break
            run = <_Run>entry.run
            Py_DECREF(run)  # the entry's reference: ``run`` holds one now
            if (
                entry.version != run.version
                or run.parent is None
                or run.tier != tier
                or (len(run.children) if dram else run.vram_children)
            ):
                continue  # stale: superseded by a later entry or no longer a frontier
            if run.pin == op:
                if pinned is None:
                    pinned = []
                pinned.append((entry.uses, entry.key, entry.version, run))
                continue
            victim = run
            break
        queue.beside = beside
        queue.has_beside = has_beside
        if pinned is not None:
            for entry.uses, entry.key, entry.version, run in pinned:
                entry.run = <PyObject*>run
                Py_INCREF(run)
                queue.push(entry)
        return victim

    cdef object _queued(self, int tier):
        """The runs of ``tier``'s live entries (of their run's current version)."""
        cdef _VictimQueue queue = self._queue_of(tier)
        cdef list runs = []
        cdef Py_ssize_t i
        cdef Entry* entry
        for i in range(queue.size + queue.has_beside):
            entry = &queue.heap[i] if i < queue.size else &queue.beside
            if entry.version == (<_Run>entry.run).version:
                runs.append(<_Run>entry.run)
        return runs

    # -- internals: reporting -------------------------------------------------------------

    cdef void _registered_range(
        self, Py_ssize_t first, Py_ssize_t last, Py_ssize_t* lo, Py_ssize_t* hi
    ) noexcept:
        """Where the registered depths within ``first..last`` lie in ``_registered``
        (and their lengths in ``_registered_lengths``): ``lo`` up to ``hi``."""
        cdef Py_ssize_t a = 0, b = self._n_registered, mid
        while a < b:  # the first at or after ``first``
            mid = (a + b) >> 1
            if self._registered[mid] < first:
                a = mid + 1
            else:
                b = mid
        lo[0] = a
        b = self._n_registered
        while a < b:  # the first after ``last``
            mid = (a + b) >> 1
            if self._registered[mid] <= last:
                a = mid + 1
            else:
                b = mid
        hi[0] = a

    cdef int _report(
        self, object namespace, object kind, int tier, bytes prompt,
        Py_ssize_t first, Py_ssize_t last,
    ) except -1:
        """One change for the blocks of ``prompt`` at depths ``first..last`` (one
        prompt's promoted or admitted blocks), at the registration lengths among them."""
        cdef Py_ssize_t lo, hi
        if self._on_change is None:
            return 0
        self._registered_range(first, last, &lo, &hi)
        if lo < hi:
            lengths = self._registered_lengths[lo:hi]
            tokens = _prefix(prompt, self._registered[hi - 1] * self.block_size)
            self._on_change(_new_change(namespace, kind, _TIERS[tier], tokens, lengths))
        return 0

    cdef int _emit_at(
        self, object namespace, object kind, int tier, bytes source, Py_ssize_t depth
    ) except -1:
        """One change at one registration length: the prefix of ``source`` (a prompt that
        holds the path) that ends with block ``depth``."""
        if self._on_change is None:
            return 0
        tokens = _prefix(source, depth * self.block_size)
        length = (depth * self.block_size,)
        self._on_change(_new_change(namespace, kind, _TIERS[tier], tokens, length))
        return 0


cdef inline object _prefix(bytes prompt, Py_ssize_t n_tokens):
    """A change's tokens: the first ``n_tokens`` of ``prompt`` as a read-only array over
    its bytes (no copy; the prompt is held by the runs anyway)."""
    return array_over(prompt, PyBytes_AS_STRING(prompt), _TOKEN, n_tokens, 0)


cdef bint _holds_bytes(object tokens, bytes data):
    """Whether ``tokens`` is a C-contiguous uint32 buffer of exactly ``data``'s bytes
    (False for anything else, which :func:`_as_bytes` then converts)."""
    cdef Py_buffer view
    cdef bint same = False
    if not PyObject_CheckBuffer(tokens):
        return False
    try:
        PyObject_GetBuffer(tokens, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except (BufferError, ValueError, TypeError):
        return False
    if holds_uint32(&view):
        same = view.len == len(data) and memcmp(view.buf, PyBytes_AS_STRING(data), view.len) == 0
    PyBuffer_Release(&view)
    return same


cdef bytes _as_bytes(object tokens):
    """The prompt's token ids as little-endian uint32 bytes: a copy of a uint32 buffer
    (the simulator's and the engine's arrays), anything else through numpy."""
    cdef Py_buffer view
    cdef bytes data = None
    if PyObject_CheckBuffer(tokens):
        try:
            PyObject_GetBuffer(tokens, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        except (BufferError, ValueError, TypeError):
            pass  # not contiguous: numpy copies it
        else:
            if holds_uint32(&view):
                data = PyBytes_FromStringAndSize(<char*>view.buf, view.len)
            PyBuffer_Release(&view)
            if data is not None:
                return data
    return np.ascontiguousarray(tokens, dtype=_TOKEN).tobytes()


def _require(condition, broken):
    if not condition:
        raise InvariantBroken(f"prefix cache: {broken}")


def _runs(_Run root):
    """``root`` and the runs below it, parents before children (the last child first)."""
    stack = [root]
    while stack:
        run = stack.pop()
        yield run
        stack.extend((<_Run>run).children.values())


def _blocks(_Run root):
    """Every block under ``root`` (and the root, depth 0) as (its run, its depth), in
    the order of a walk that visits a block's children last child first."""
    cdef _Run run
    for run in _runs(root):
        for depth in range(run.first, run.last + 1):
            yield run, depth
