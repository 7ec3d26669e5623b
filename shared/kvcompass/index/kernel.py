"""The compiled write path of a Ludo table and its Othello forest.

Inserting a key is sequential by nature (a cuckoo path, a seed search, a walk of one
Othello tree), so in Python it costs a few thousand bytecodes. These functions do the
same work on the tables' flat numpy arrays, compiled by numba, one event batch per call.
The rare whole-table steps stay in Python: growing into a new generation and rebuilding
the locator (both vectorised); the kernel stops and says which one it needs.

State lives in two named tuples of arrays (numba passes them by reference, so every
write lands in the table's own storage) plus a ``uint64`` geometry vector; counters live
in small ``int64`` arrays so the kernel can update them in place. ``apply_writes``, called
once or twice per event batch, takes the tuples' fixed-type arrays as one descriptor of
addresses (:func:`write_descriptor`): unboxing 25 arrays per call cost more than the
writes of a small batch. A call first asks the memory for every line its writes may
read (:func:`_prefetch_writes`): between two calls for one table the rest of the process
evicts it, and an insert read a dozen cold lines one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar, cast

import numba
import numpy as np
from numba import carray  # type: ignore[attr-defined]
from numpy.typing import NDArray

from kvcompass.hashing import mix64_compiled
from kvcompass.index.addresses import address, address_of, prefetch
from kvcompass.index.geometry import TableGeometry
from kvcompass.keys import SHARD_SALT

__all__ = [
    "CYCLE",
    "DESCRIPTOR_LENGTH",
    "DONE",
    "GEOMETRY_LENGTH",
    "MAX_CUCKOO_MOVES",
    "NEED_GROW",
    "NEED_REBUILD",
    "NO_SEED",
    "OthelloArrays",
    "TableArrays",
    "apply_writes",
    "find_seed",
    "first_foreign",
    "geometry_vector",
    "mark_buckets",
    "othello_add_edge",
    "othello_remove_edge",
    "othello_smaller_side",
    "othello_toggle",
    "write_descriptor",
]

F = TypeVar("F", bound=Callable[..., Any])
#: Integers inside the kernel: Python ints from callers, numpy int64 from arrays.
Index: TypeAlias = int | np.integer[Any]


def _compiled(fn: F) -> F:
    # cache=True keeps the machine code beside this module, so only the first process
    # on a machine pays the compile (a few seconds).
    return cast(F, numba.njit(cache=True, nogil=True)(fn))


#: ``apply_writes`` status: every write applied.
DONE = 0
#: The write at the returned index needs a bigger table (full, or no cuckoo path);
#: nothing of it was applied. Grow, then resume at that index.
NEED_GROW = 1
#: The write at the returned index was applied but its key closed a cycle in the
#: locator, so it has no Othello edge yet. Rebuild the locator, then resume after it.
NEED_REBUILD = 2
#: No 8-bit seed separates some bucket's keys (about 1e-11 per re-seed): the table is
#: mid-move and must be reloaded from its last snapshot.
NO_SEED = 3
#: ``othello_smaller_side`` count for "u and v are already connected".
CYCLE = -1

# Geometry vector slots (``geometry_vector``).
_NB, _MA, _MB, _CAP, _BSEED, _OSEED, _SSEED, _FSEED, _FPBITS = range(9)
# TableArrays.state slots.
_COUNT, _N_DIRTY, _BSTAMP = range(3)
# OthelloArrays.state slots.
_FREE_TOP, _N_WDIRTY, _NSTAMP = range(3)

_EMPTY = -1
#: Longest cuckoo path: at most 4 displaced keys (5 buckets), as in Ludo.
MAX_CUCKOO_MOVES = 4
#: Buckets a breadth-first cuckoo search of depth 4 can enqueue: 2·(1+4+16+64+256).
_MAX_BFS = 2 * 341
_SEEDS_PER_WORD = 32
_SEED_WORDS = 8
#: Stamps wrap below 2^29 so an int32 mark holds 2·stamp + 1.
_STAMP_LIMIT = 1 << 29

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LOW_BITS = np.uint64(0x5555555555555555)
_M32 = np.uint64(0xFFFFFFFF)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)
_U4 = np.uint64(4)
_U6 = np.uint64(6)
_U8 = np.uint64(8)
_U32 = np.uint64(32)
_U63 = np.uint64(63)
_U64 = np.uint64(64)


class TableArrays(NamedTuple):
    """A Ludo table's storage: the view image arrays and the maintenance side."""

    keys: NDArray[np.int64]  # full key per cell, -1 when empty
    kid: NDArray[np.int32]  # Othello key id per cell
    alt: NDArray[np.int32]  # the other candidate bucket of the cell's key
    sig: NDArray[np.uint64]  # the key's slot-hash word 0
    fill: NDArray[np.uint8]  # keys per bucket
    seeds: NDArray[np.uint8]  # view image: bucket seeds
    cells: NDArray[Any]  # view image: values (uint32 or uint64)
    fps: NDArray[Any]  # view image fingerprints (uint8/uint16), or a scratch array
    bucket_dirty: NDArray[np.uint8]  # 1 when the bucket is in dirty_buckets
    dirty_buckets: NDArray[np.int64]  # buckets written since the last patch
    bucket_mark: NDArray[np.int32]  # scratch: cuckoo search's visited stamps
    state: NDArray[np.int64]  # count, dirty buckets, search stamp


class OthelloArrays(NamedTuple):
    """An Othello forest: node bits and intrusive adjacency lists over half-edges."""

    words: NDArray[np.uint64]  # node bits, packed
    head: NDArray[np.int32]  # first half-edge (2·kid + side) at each node
    nxt: NDArray[np.int32]  # next half-edge at the same node
    node: NDArray[np.int32]  # node of each half-edge
    free: NDArray[np.int32]  # stack of unused key ids
    word_dirty: NDArray[np.uint8]  # 1 when the word is in dirty_words
    dirty_words: NDArray[np.int64]  # words flipped since the last patch
    mark: NDArray[np.int32]  # scratch: visited stamps (2·stamp: u side, +1: v side)
    state: NDArray[np.int64]  # free-stack top, dirty words, search stamp


class _Scratch(NamedTuple):
    """Work arrays of one ``apply_writes`` call, allocated once instead of per insert."""

    side: NDArray[np.int32]  # a smaller-side search's nodes
    bfs: NDArray[np.int64]  # cuckoo search entries: bucket, parent, cell, depth
    entry_ints: NDArray[np.int64]  # a re-seeded bucket's keys, key ids, alt buckets
    entry_words: NDArray[np.uint64]  # ... and their values, fingerprints, slot words
    slots: NDArray[np.int64]  # ... and their cells under the new seed


#: The arrays a write descriptor describes, with their types: every field of a table but
#: its cells and fingerprints (whose types vary, so they travel as arrays), then every
#: field of its Othello forest.
_DESCRIBED_TABLE: Final = (
    ("keys", np.int64),
    ("kid", np.int32),
    ("alt", np.int32),
    ("sig", np.uint64),
    ("fill", np.uint8),
    ("seeds", np.uint8),
    ("bucket_dirty", np.uint8),
    ("dirty_buckets", np.int64),
    ("bucket_mark", np.int32),
    ("state", np.int64),
)
_DESCRIBED_OTHELLO: Final = (
    ("words", np.uint64),
    ("head", np.int32),
    ("nxt", np.int32),
    ("node", np.int32),
    ("free", np.int32),
    ("word_dirty", np.uint8),
    ("dirty_words", np.int64),
    ("mark", np.int32),
    ("state", np.int64),
)


def _row(arrays: str, name: str) -> int:
    """The descriptor row of one described array (``arrays``: "table" or "othello")."""
    rows = [f"table.{n}" for n, _ in _DESCRIBED_TABLE]
    rows += [f"othello.{n}" for n, _ in _DESCRIBED_OTHELLO]
    return rows.index(f"{arrays}.{name}")


_KEYS_ROW, _KID_ROW, _ALT_ROW, _SIG_ROW = (_row("table", n) for n in ("keys", "kid", "alt", "sig"))
_FILL_ROW, _SEEDS_ROW, _BUCKET_DIRTY_ROW = (
    _row("table", n) for n in ("fill", "seeds", "bucket_dirty")
)
_WORDS_ROW, _HEAD_ROW, _NXT_ROW, _NODE_ROW, _FREE_ROW, _MARK_ROW, _OTHELLO_STATE_ROW = (
    _row("othello", n) for n in ("words", "head", "nxt", "node", "free", "mark", "state")
)


#: uint64 items of a write descriptor: (address, length) per described array.
DESCRIPTOR_LENGTH: Final = 2 * (len(_DESCRIBED_TABLE) + len(_DESCRIBED_OTHELLO))
#: uint64 items of a geometry vector.
GEOMETRY_LENGTH: Final = _FPBITS + 1


def write_descriptor(table: TableArrays, othello: OthelloArrays) -> NDArray[np.uint64]:
    """(address, length) of each array :func:`apply_writes` reaches by address, in the
    order it reads them. The caller keeps ``table`` and ``othello`` alive and their
    arrays in place while it uses the descriptor."""
    rows: list[int] = []
    for arrays, described in ((table, _DESCRIBED_TABLE), (othello, _DESCRIBED_OTHELLO)):
        for name, dtype in described:
            array = getattr(arrays, name)
            if array.dtype != dtype or array.ndim != 1:
                raise ValueError(f"{name}: expected a 1-d {np.dtype(dtype)} array")
            rows += (address_of(array), array.size)
    return np.array(rows, dtype=np.uint64)


def geometry_vector(g: TableGeometry) -> NDArray[np.uint64]:
    """The numbers of a table geometry in the order the kernel reads them."""
    return np.array(
        [
            g.nb,
            g.ma,
            g.mb,
            g.capacity,
            g.bucket_seed,
            g.othello_seed,
            g.slot_seed,
            g.fingerprint_seed,
            g.fingerprint_bits,
        ],
        dtype=np.uint64,
    )


# -- hashing (bit-identical to kvcompass.hashing / TableGeometry) -------------------------


_SHARD_SALT = np.uint64(SHARD_SALT)


@_compiled
def first_foreign(keys: NDArray[np.uint64], n_shards: Index, shard: Index) -> int:
    """Index of the first key not of ``shard`` (:func:`kvcompass.keys.shard_of`), -1 if
    every key is: a maintenance unit checks every batch so, where hashing a few keys in
    Python costs microseconds (tests hold it to :func:`kvcompass.keys.shard_of`).
    """
    n = np.uint64(n_shards)
    for j in range(len(keys)):
        if np.int64(mix64_compiled(keys[j] ^ _SHARD_SALT) % n) != shard:
            return j
    return -1


@_compiled
def _slot_word(geo: NDArray[np.uint64], key: np.uint64, word: Index) -> np.uint64:
    return mix64_compiled(key ^ geo[_SSEED] ^ (np.uint64(word) * _GOLDEN))


# -- Othello forest ------------------------------------------------------------------------


@_compiled
def _next_stamp(mark: NDArray[np.int32], state: NDArray[np.int64], slot: Index) -> Index:
    stamp = state[slot] + 1
    if stamp >= _STAMP_LIMIT:
        mark[:] = 0
        stamp = 1
    state[slot] = stamp
    return np.int64(stamp)


@_compiled
def othello_smaller_side(
    o: OthelloArrays, u: Index, v: Index, skip_kid: Index, out: NDArray[np.int32]
) -> tuple[Index, NDArray[np.int32]]:
    """Nodes of the smaller of u's and v's trees (ignoring ``skip_kid``'s edge).

    Returns (count, nodes) with the nodes in ``nodes[:count]`` (``out`` or a larger
    copy of it), or (CYCLE, out) when u and v are connected. Both sides are explored
    one node at a time, so the cost is about twice the smaller side.
    """
    head, nxt, node, mark = o.head, o.nxt, o.node, o.mark
    # An isolated node is a whole tree of one: about half of all nodes at any load.
    if skip_kid < 0:
        if head[u] < 0:
            out[0] = u
            return 1, out
        if head[v] < 0:
            out[0] = v
            return 1, out
    stamp = _next_stamp(mark, o.state, _NSTAMP)
    mu, mv = 2 * stamp, 2 * stamp + 1
    seen_u = np.empty(16, dtype=np.int32)
    seen_v = np.empty(16, dtype=np.int32)
    seen_u[0], seen_v[0] = u, v
    mark[u], mark[v] = mu, mv
    nu = nv = 1
    ru = rv = 0
    # The u and v steps are written out, not shared: with one helper for both, inserts
    # at 95% load measured 15-20 µs against 10-16 µs (three runs each, noisy machine).
    while True:
        if ru == nu:
            break
        h = head[seen_u[ru]]
        ru += 1
        while h >= 0:
            if h >> 1 != skip_kid:
                m = node[h ^ 1]
                if mark[m] != mu:
                    if mark[m] == mv:
                        return CYCLE, out
                    mark[m] = mu
                    if nu == len(seen_u):
                        seen_u = np.concatenate((seen_u, np.empty(nu, dtype=np.int32)))
                    seen_u[nu] = m
                    nu += 1
            h = nxt[h]
        if rv == nv:
            seen_u, nu = seen_v, nv
            break
        h = head[seen_v[rv]]
        rv += 1
        while h >= 0:
            if h >> 1 != skip_kid:
                m = node[h ^ 1]
                if mark[m] != mv:
                    if mark[m] == mu:
                        return CYCLE, out
                    mark[m] = mv
                    if nv == len(seen_v):
                        seen_v = np.concatenate((seen_v, np.empty(nv, dtype=np.int32)))
                    seen_v[nv] = m
                    nv += 1
            h = nxt[h]
    if nu > len(out):
        out = np.empty(nu, dtype=np.int32)
    out[:nu] = seen_u[:nu]
    return nu, out


@_compiled
def _flip(o: OthelloArrays, nodes: NDArray[np.int32], count: Index) -> None:
    words, word_dirty = o.words, o.word_dirty
    for i in range(count):
        n = nodes[i]
        w = n >> 6
        words[w] ^= _U1 << np.uint64(n & 63)
        if not word_dirty[w]:
            word_dirty[w] = 1
            o.dirty_words[o.state[_N_WDIRTY]] = w
            o.state[_N_WDIRTY] += 1


@_compiled
def _bit(o: OthelloArrays, n: Index) -> Index:
    return np.int64((o.words[n >> 6] >> np.uint64(n & 63)) & _U1)


@_compiled
def _link(o: OthelloArrays, h: Index, n: Index) -> None:
    o.node[h] = n
    o.nxt[h] = o.head[n]
    o.head[n] = h


@_compiled
def _unlink(o: OthelloArrays, h: Index) -> None:
    n = o.node[h]
    cur = o.head[n]
    if cur == h:
        o.head[n] = o.nxt[h]
    else:
        while o.nxt[cur] != h:
            cur = o.nxt[cur]
        o.nxt[cur] = o.nxt[h]
    o.node[h] = -1
    o.nxt[h] = -1


@_compiled
def othello_add_edge(
    o: OthelloArrays, a: Index, b: Index, bit: Index, side: NDArray[np.int32], count: Index
) -> Index:
    """Add edge a–b carrying ``bit``; ``side[:count]`` is from the smaller-side search.

    Returns the new key id.
    """
    if bit ^ _bit(o, a) ^ _bit(o, b):
        _flip(o, side, count)
    top = o.state[_FREE_TOP] - 1
    o.state[_FREE_TOP] = top
    kid = np.int64(o.free[top])
    _link(o, 2 * kid, a)
    _link(o, 2 * kid + 1, b)
    return kid


@_compiled
def othello_remove_edge(o: OthelloArrays, kid: Index) -> None:
    """Forget a key's edge. No bit changes: every other key keeps its XOR."""
    _unlink(o, 2 * kid)
    _unlink(o, 2 * kid + 1)
    top = o.state[_FREE_TOP]
    o.free[top] = kid
    o.state[_FREE_TOP] = top + 1


@_compiled
def othello_toggle(o: OthelloArrays, kid: Index, scratch: NDArray[np.int32]) -> bool:
    """Invert one key's bit; False if the graph has a cycle (it never should)."""
    a, b = np.int64(o.node[2 * kid]), np.int64(o.node[2 * kid + 1])
    count, side = othello_smaller_side(o, a, b, kid, scratch)
    if count == CYCLE:
        return False
    _flip(o, side, count)
    return True


# -- Ludo table ------------------------------------------------------------------------------


@_compiled
def _mark_bucket(t: TableArrays, b: Index) -> None:
    if not t.bucket_dirty[b]:
        t.bucket_dirty[b] = 1
        t.dirty_buckets[t.state[_N_DIRTY]] = b
        t.state[_N_DIRTY] += 1


@_compiled
def mark_buckets(t: TableArrays, buckets: NDArray[np.int64]) -> None:
    """Record buckets written outside the kernel (vectorised value updates)."""
    for b in buckets:
        _mark_bucket(t, b)


@_compiled
def _find(keys: NDArray[np.int64], key: Index, b0: Index, b1: Index) -> Index:
    p = b0 << 2
    for q in range(p, p + 4):
        if keys[q] == key:
            return q
    p = b1 << 2
    for q in range(p, p + 4):
        if keys[q] == key:
            return q
    return -1


@_compiled
def _clear(t: TableArrays, pos: Index) -> None:
    t.keys[pos] = _EMPTY
    t.kid[pos] = _EMPTY
    t.alt[pos] = _EMPTY
    t.sig[pos] = 0
    t.cells[pos] = 0
    t.fps[pos] = 0
    t.fill[pos >> 2] -= 1
    _mark_bucket(t, pos >> 2)


@_compiled
def find_seed(
    geo: NDArray[np.uint64],
    keys: NDArray[np.int64],
    sigs: NDArray[np.uint64],
    n: Index,
    slots: NDArray[np.int64],
) -> Index:
    """Smallest seed under which the n keys occupy distinct cells (see seeds.find_seed).

    Writes each key's cell into ``slots``; returns -1 when no 8-bit seed works.
    """
    words = sigs.copy()
    for word in range(_SEED_WORDS):
        if word:
            for i in range(n):
                words[i] = _slot_word(geo, np.uint64(keys[i]), word)
        collide = np.uint64(0)
        for i in range(n):
            for j in range(i + 1, n):
                x = words[i] ^ words[j]
                collide |= ~(x | (x >> _U1)) & _LOW_BITS
        valid = ~collide & _LOW_BITS
        if valid:
            bit = np.uint64(0)
            while not (valid >> bit) & _U1:
                bit += _U1
            for i in range(n):
                slots[i] = np.int64((words[i] >> bit) & _U3)
            return word * _SEEDS_PER_WORD + np.int64(bit >> _U1)
    return -1


@_compiled
def _place(
    t: TableArrays,
    geo: NDArray[np.uint64],
    s: _Scratch,
    bucket: Index,
    key: Index,
    value: np.uint64,
    fp: np.uint64,
    alt: Index,
    sig0: np.uint64,
    kid: Index,
) -> Index:
    """Put a key into a bucket with a free cell, re-seeding it if needed.

    Returns its cell, or -1 when no seed separates the bucket's keys.
    """
    keys = t.keys
    base = bucket << 2
    t.fill[bucket] += 1
    _mark_bucket(t, bucket)
    # Keep the bucket's seed when the new key's cell under it is free: one shift
    # instead of a seed search, and only one cell of the bucket changes.
    seed: Index = np.int64(t.seeds[bucket])
    if seed < _SEEDS_PER_WORD:
        pos = base + np.int64((sig0 >> np.uint64(seed << 1)) & _U3)
    else:
        word = _slot_word(geo, np.uint64(key), seed >> 5)
        pos = base + np.int64((word >> np.uint64((seed & 31) << 1)) & _U3)
    if keys[pos] == _EMPTY:
        keys[pos] = key
        t.cells[pos] = value
        t.fps[pos] = fp
        t.kid[pos] = kid
        t.alt[pos] = alt
        t.sig[pos] = sig0
        return pos
    ek, eid, ealt = s.entry_ints[0], s.entry_ints[1], s.entry_ints[2]
    ev, ef, esig = s.entry_words[0], s.entry_words[1], s.entry_words[2]
    n = 0
    for q in range(base, base + 4):
        if keys[q] != _EMPTY:
            ek[n], ev[n], ef[n] = keys[q], t.cells[q], t.fps[q]
            eid[n], ealt[n], esig[n] = t.kid[q], t.alt[q], t.sig[q]
            n += 1
    ek[n], ev[n], ef[n], eid[n], ealt[n], esig[n] = key, value, fp, kid, alt, sig0
    n += 1
    slots = s.slots
    seed = find_seed(geo, ek, esig, n, slots)
    if seed < 0:
        return -1
    for q in range(base, base + 4):
        keys[q] = _EMPTY
        t.cells[q] = 0
        t.fps[q] = 0
        t.kid[q] = _EMPTY
        t.alt[q] = _EMPTY
        t.sig[q] = 0
    for i in range(n):
        q = base + slots[i]
        keys[q], t.cells[q], t.fps[q] = ek[i], ev[i], ef[i]
        t.kid[q], t.alt[q], t.sig[q] = eid[i], ealt[i], esig[i]
    t.seeds[bucket] = seed
    return base + np.int64(slots[n - 1])


@_compiled
def _displace(
    t: TableArrays,
    o: OthelloArrays,
    geo: NDArray[np.uint64],
    s: _Scratch,
    b0: Index,
    b1: Index,
    toggle: bool,
) -> Index:
    """Free a cell in b0 or b1 by a breadth-first cuckoo path; return that bucket.

    Returns -1 (nothing moved) when no path of at most 4 moves exists, -2 when a
    move found no seed.
    """
    fill, alts = t.fill, t.alt
    e_bucket, e_parent, e_cell, e_depth = s.bfs[0], s.bfs[1], s.bfs[2], s.bfs[3]
    stamp = _next_stamp(t.bucket_mark, t.state, _BSTAMP)
    mark = t.bucket_mark
    e_bucket[0], e_parent[0], e_cell[0], e_depth[0] = b0, -1, -1, 1
    e_bucket[1], e_parent[1], e_cell[1], e_depth[1] = b1, -1, -1, 1
    mark[b0] = stamp
    mark[b1] = stamp
    n = 2
    found = -1
    i = 0
    while found < 0 and i < n:
        bucket, depth = e_bucket[i], e_depth[i]
        if depth > MAX_CUCKOO_MOVES:
            break
        base = bucket << 2
        for q in range(base, base + 4):
            alt = alts[q]
            if mark[alt] == stamp:  # includes alt == bucket: a key with one candidate
                continue
            mark[alt] = stamp
            e_bucket[n], e_parent[n], e_cell[n], e_depth[n] = alt, i, q, depth + 1
            n += 1
            if fill[alt] < 4:
                found = n - 1
                break
        i += 1
    if found < 0:
        return -1
    # Move keys backwards from the free end, so every key lands before its old cell
    # is reused.
    e = found
    while e_parent[e] >= 0:
        bucket, q = e_bucket[e], e_cell[e]
        key, value, fp = t.keys[q], np.uint64(t.cells[q]), np.uint64(t.fps[q])
        kid, sig0 = np.int64(t.kid[q]), t.sig[q]
        _clear(t, q)
        if _place(t, geo, s, bucket, key, value, fp, q >> 2, sig0, kid) < 0:
            return -2
        if toggle:
            othello_toggle(o, kid, s.side)
        e = e_parent[e]
    return np.int64(e_bucket[e])


@_compiled
def _roomiest(t: TableArrays, sig0: np.uint64, b0: Index, b1: Index) -> Index:
    """A candidate bucket with room, preferring one whose seed needs no change."""
    for b in (b0, b1):
        if t.fill[b] < 4:
            seed = np.int64(t.seeds[b])
            if seed < _SEEDS_PER_WORD:
                cell = (b << 2) | np.int64((sig0 >> np.uint64(seed << 1)) & _U3)
                if t.keys[cell] < 0:
                    return b
    return b0 if t.fill[b0] < 4 else b1


@_compiled
def _insert(
    t: TableArrays,
    o: OthelloArrays,
    geo: NDArray[np.uint64],
    s: _Scratch,
    key: Index,
    value: np.uint64,
    b0: Index,
    b1: Index,
) -> Index:
    if t.state[_COUNT] >= geo[_CAP]:
        return NEED_GROW
    ma, mb = geo[_MA], geo[_MB]
    h = mix64_compiled(np.uint64(key) ^ geo[_OSEED])
    a = np.int64(((h & _M32) * ma) >> _U32)
    b = np.int64(ma + (((h >> _U32) * mb) >> _U32))
    # Cycle test before any move: moves only toggle bits, never change edges.
    count, side = othello_smaller_side(o, a, b, -1, s.side)
    toggle = count != CYCLE
    sig0 = _slot_word(geo, np.uint64(key), 0)
    moved = False
    if t.fill[b0] < 4 or t.fill[b1] < 4:
        root = _roomiest(t, sig0, b0, b1)
    else:
        root = _displace(t, o, geo, s, b0, b1, toggle)
        if root == -1:
            return NEED_GROW
        if root == -2:
            return NO_SEED
        moved = True
    fp = np.uint64(0)
    if geo[_FPBITS]:
        fp = mix64_compiled(np.uint64(key) ^ geo[_FSEED]) >> (_U64 - geo[_FPBITS])
    other = b1 if root == b0 else b0
    pos = _place(t, geo, s, root, key, value, fp, other, sig0, -1)
    if pos < 0:
        return NO_SEED
    t.state[_COUNT] += 1
    if not toggle:
        return NEED_REBUILD
    if moved:  # the moves' toggles reused the scratch that held the side
        count, side = othello_smaller_side(o, a, b, -1, s.side)
    t.kid[pos] = othello_add_edge(o, a, b, 0 if root == b0 else 1, side, count)
    return DONE


@_compiled
def _described(desc: NDArray[np.uint64], row: int, dtype: Any) -> NDArray[Any]:
    return carray(address(desc[2 * row]), desc[2 * row + 1], dtype)


@_compiled
def _prefetch_writes(
    desc: NDArray[np.uint64],
    cells: NDArray[Any],
    geo: NDArray[np.uint64],
    keys: NDArray[np.uint64],
    start: Index,
) -> None:
    """Ask for the lines the writes of ``keys[start:]`` may read, all at once, so their
    misses overlap: both candidate buckets' cells in every per-cell array, their
    per-bucket bytes, both locator nodes' heads, marks and bit words, and the half-edges
    of the key ids the inserts would take next."""
    nb, ma, mb = geo[_NB], geo[_MA], geo[_MB]
    cells_at, cell_bytes = np.uint64(cells.ctypes.data), np.uint64(cells.itemsize)
    keys_at, kid_at, alt_at, sig_at = (
        desc[2 * _KEYS_ROW],
        desc[2 * _KID_ROW],
        desc[2 * _ALT_ROW],
        desc[2 * _SIG_ROW],
    )
    fill_at, seeds_at, dirty_at = (
        desc[2 * _FILL_ROW],
        desc[2 * _SEEDS_ROW],
        desc[2 * _BUCKET_DIRTY_ROW],
    )
    words_at, head_at, mark_at = desc[2 * _WORDS_ROW], desc[2 * _HEAD_ROW], desc[2 * _MARK_ROW]
    for i in range(start, len(keys)):
        key = keys[i]
        x = mix64_compiled(key ^ geo[_BSEED])
        for b in (((x & _M32) * nb) >> _U32, ((x >> _U32) * nb) >> _U32):
            cell = b << _U2
            prefetch(keys_at + cell * _U8)
            prefetch(sig_at + cell * _U8)
            prefetch(kid_at + cell * _U4)
            prefetch(alt_at + cell * _U4)
            prefetch(cells_at + cell * cell_bytes)
            prefetch(fill_at + b)
            prefetch(seeds_at + b)
            prefetch(dirty_at + b)
        h = mix64_compiled(key ^ geo[_OSEED])
        for n in (((h & _M32) * ma) >> _U32, ma + (((h >> _U32) * mb) >> _U32)):
            prefetch(head_at + n * _U4)
            prefetch(mark_at + n * _U4)
            prefetch(words_at + (n >> _U6) * _U8)
    free = _described(desc, _FREE_ROW, np.int32)
    top = _described(desc, _OTHELLO_STATE_ROW, np.int64)[_FREE_TOP]
    for j in range(min(len(keys) - start, top)):
        kid = np.uint64(free[top - 1 - j])  # half-edges 2·kid and 2·kid + 1: 8 bytes
        prefetch(desc[2 * _NXT_ROW] + kid * _U8)
        prefetch(desc[2 * _NODE_ROW] + kid * _U8)


@_compiled
def apply_writes(
    desc: NDArray[np.uint64],
    cells: NDArray[Any],
    fps: NDArray[Any],
    geo: NDArray[np.uint64],
    keys: NDArray[np.uint64],
    clear: NDArray[np.uint64],
    bits: NDArray[np.uint64],
    start: Index,
) -> tuple[Index, int]:
    """value := (value & ~clear[i]) | bits[i] for keys[start:], in order (0 removes).

    ``desc`` is the :func:`write_descriptor` of a table and its forest, ``cells`` and
    ``fps`` that table's own. Returns (status, index): DONE, or the status that stopped
    it at write ``index`` (see the status constants). Inputs must already be validated:
    keys below 2^63, bits within the value width.
    """
    t = TableArrays(
        _described(desc, 0, np.int64),
        _described(desc, 1, np.int32),
        _described(desc, 2, np.int32),
        _described(desc, 3, np.uint64),
        _described(desc, 4, np.uint8),
        _described(desc, 5, np.uint8),
        cells,
        fps,
        _described(desc, 6, np.uint8),
        _described(desc, 7, np.int64),
        _described(desc, 8, np.int32),
        _described(desc, 9, np.int64),
    )
    o = OthelloArrays(
        _described(desc, 10, np.uint64),
        _described(desc, 11, np.int32),
        _described(desc, 12, np.int32),
        _described(desc, 13, np.int32),
        _described(desc, 14, np.int32),
        _described(desc, 15, np.uint8),
        _described(desc, 16, np.int64),
        _described(desc, 17, np.int32),
        _described(desc, 18, np.int64),
    )
    nb = geo[_NB]
    s = _Scratch(
        np.empty(64, dtype=np.int32),
        np.empty((4, _MAX_BFS + 2), dtype=np.int64),
        np.empty((3, 4), dtype=np.int64),
        np.empty((3, 4), dtype=np.uint64),
        np.empty(4, dtype=np.int64),
    )
    _prefetch_writes(desc, cells, geo, keys, start)
    for i in range(start, len(keys)):
        key = keys[i]
        x = mix64_compiled(key ^ geo[_BSEED])
        b0 = np.int64(((x & _M32) * nb) >> _U32)
        b1 = np.int64(((x >> _U32) * nb) >> _U32)
        k = np.int64(key)
        pos = _find(t.keys, k, b0, b1)
        if pos >= 0:
            old = np.uint64(t.cells[pos])
            value = (old & ~clear[i]) | bits[i]
            if value == old:
                continue
            if value:
                t.cells[pos] = value
                _mark_bucket(t, pos >> 2)
            else:
                othello_remove_edge(o, t.kid[pos])
                _clear(t, pos)
                t.state[_COUNT] -= 1
        elif bits[i]:
            status = _insert(t, o, geo, s, k, bits[i], b0, b1)
            if status != DONE:
                return status, i
    return DONE, len(keys)
