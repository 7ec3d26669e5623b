"""The index's match, compiled: every probe of a query in one call.

In Python a view lookup costs four 64-bit mixes on big integers (about a microsecond),
and a 4K-token prompt probes 8 (testbed-3region) to 70 (sim-16region) keys, each in a
table of its own shard, then decodes the holders. This kernel does all of it in one
numba call over a descriptor table: per (shard, table) row, the addresses of the
table's arrays, and its geometry. Both readers use it. The shared-memory reader
describes its own mapping of each segment, rebuilds a row whenever it maps a table
again, and runs the kernel only inside a read section, after checking that every row
is current; a mapping stays valid until the reader itself closes it, even after the
writer unlinks the segment. The in-process :class:`~kvcompass.index.discovery.DiscoveryView`
takes each view's own row (:attr:`~kvcompass.index.view.LudoView.descriptor`), current
for as long as that view keeps its buffer.

The lookup is :meth:`kvcompass.index.view.LudoView.lookup` step for step (a unit test
checks the two agree), taken for every probe one step at a time; a later nonzero tier
field of a worker overwrites an earlier one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import numba
import numpy as np
from numba import carray  # type: ignore[attr-defined]
from numpy.typing import NDArray

from kvcompass.hashing import GOLDEN64, MASK32
from kvcompass.hashing import mix64_compiled as _mix64
from kvcompass.index.addresses import address, prefetch
from kvcompass.index.geometry import TableGeometry
from kvcompass.index.image import ImageLayout
from kvcompass.keys import SHARD_SALT

__all__ = ["N_COLUMNS", "UNCHECKED", "describe", "match_probes", "table_workers", "warm_up"]

# Descriptor columns (uint64).
_SEEDS, _CELLS, _WORDS, _FPS, _CELL_BYTES, _NB, _MA, _MB = range(8)
_BSEED, _OSEED, _SSEED, _FSEED, _FSHIFT = range(8, 13)
N_COLUMNS: Final = 13

#: A probe row's ``after`` when the row's hits count whatever the worker matched before.
UNCHECKED: Final = np.iinfo(np.int64).min

_U32 = np.uint64(32)
_U6 = np.uint64(6)
_U5 = np.uint64(5)
_U63 = np.uint64(63)
_U31 = np.uint64(31)
_U3 = np.uint64(3)
_U2 = np.uint64(2)
_U4 = np.uint64(4)
_U8 = np.uint64(8)
_U56 = np.uint64(56)
_U1 = np.uint64(1)
_M32 = np.uint64(MASK32)
_GOLDEN = np.uint64(GOLDEN64)
_SALT = np.uint64(SHARD_SALT)

F = TypeVar("F", bound=Callable[..., Any])


def _compiled(fn: F) -> F:
    # cache=True: compiled once per machine, loaded from beside this module after.
    return cast(F, numba.njit(cache=True, nogil=True)(fn))


@_compiled
def _at(at_address: np.uint64, dtype: Any) -> np.uint64:
    return np.uint64(carray(address(at_address), 1, dtype)[0])


@_compiled
def _bucket(d: NDArray[np.uint64], key: np.uint64) -> np.uint64:
    """The key's bucket: the one its two locator bits choose."""
    hb = _mix64(key ^ d[_BSEED])
    x = _mix64(key ^ d[_OSEED])
    ma = d[_MA]
    ia = ((x & _M32) * ma) >> _U32
    ib = ma + (((x >> _U32) * d[_MB]) >> _U32)
    word_a = _at(d[_WORDS] + (ia >> _U6) * _U8, np.uint64)
    word_b = _at(d[_WORDS] + (ib >> _U6) * _U8, np.uint64)
    if ((word_a >> (ia & _U63)) ^ (word_b >> (ib & _U63))) & _U1:
        b = ((hb >> _U32) * d[_NB]) >> _U32
    else:
        b = ((hb & _M32) * d[_NB]) >> _U32
    return np.uint64(b)


@_compiled
def _cell(d: NDArray[np.uint64], key: np.uint64, b: np.uint64) -> np.uint64:
    """The key's cell in bucket ``b``: the one the bucket's seed places it in."""
    seed = _at(d[_SEEDS] + b, np.uint8)
    x = _mix64(key ^ d[_SSEED] ^ ((seed >> _U5) * _GOLDEN))
    return (b << _U2) | ((x >> ((seed & _U31) << _U1)) & _U3)


@_compiled
def _value(d: NDArray[np.uint64], key: np.uint64, pos: np.uint64) -> np.uint64:
    """The value in cell ``pos`` (0 when the key's fingerprint does not match)."""
    if d[_CELL_BYTES] == _U4:
        value = _at(d[_CELLS] + pos * _U4, np.uint32)
    else:
        value = _at(d[_CELLS] + pos * _U8, np.uint64)
    if d[_FPS] and value:
        if d[_FSHIFT] >= _U56:  # up to 8 fingerprint bits: one byte per cell
            stored = _at(d[_FPS] + pos, np.uint8)
        else:
            stored = _at(d[_FPS] + pos * _U2, np.uint16)
        if stored != _mix64(key ^ d[_FSEED]) >> d[_FSHIFT]:
            return np.uint64(0)
    return value


@_compiled
def _prefetch_lookup(d: NDArray[np.uint64], key: np.uint64) -> None:
    """Ask for every line the key's lookup may read: both locator words, and both
    candidate buckets' seed, cells and fingerprints."""
    hb = _mix64(key ^ d[_BSEED])
    x = _mix64(key ^ d[_OSEED])
    ma = d[_MA]
    ia = ((x & _M32) * ma) >> _U32
    ib = ma + (((x >> _U32) * d[_MB]) >> _U32)
    prefetch(d[_WORDS] + (ia >> _U6) * _U8)
    prefetch(d[_WORDS] + (ib >> _U6) * _U8)
    for b in ((hb & _M32) * d[_NB]) >> _U32, ((hb >> _U32) * d[_NB]) >> _U32:
        prefetch(d[_SEEDS] + b)
        prefetch(d[_CELLS] + b * _U4 * d[_CELL_BYTES])
        if d[_FPS]:
            prefetch(d[_FPS] + b * (_U4 if d[_FSHIFT] >= _U56 else _U8))


@_compiled
def match_probes(
    desc: NDArray[np.uint64],
    n_tables: int,
    keys: NDArray[np.int64],
    probes: NDArray[np.int64],
    workers: NDArray[np.int64],
    lengths: NDArray[np.int64],
    tiers: NDArray[np.int64],
    touched: NDArray[np.uint8],
) -> None:
    """Probe (key index, table id, length, after) rows in order: a later nonzero field
    of a worker overwrites an earlier one, so give each table's probes by ascending
    length. Unless ``after`` is :data:`UNCHECKED`, a field counts only if its worker's
    match so far is exactly ``after`` (the previous length queried in that region): a
    worker holding a prefix holds every shorter one, so a hit that does not extend the
    worker's chain is a false locator (a never-inserted key landing on an occupied cell).

    A negative length marks a guard: a hit there records ``length`` for the chain's next
    row to check (``after`` = ``length``) but credits nothing, as every negative length
    is cleared to 0 (and its tier with it) once all rows are probed. A guard at a
    shorter length the workers register lets the chain check its first queried length.

    A row whose key index is past the end of ``keys`` is skipped: an edge's rows cover
    its every query length, and a prompt has keys only up to its own length.
    ``workers[table, field]`` is the global worker index of a field; ``lengths`` and
    ``tiers`` (one per worker) and ``touched`` (one per shard) are zeroed first.
    """
    lengths[:] = 0
    tiers[:] = 0
    touched[:] = 0
    n_shards = np.uint64(len(desc) // n_tables)
    n_keys = len(keys)
    n = len(probes)
    rows = np.full(n, -1, np.int64)  # each probe's descriptor row (-1: skipped)
    where = np.empty(n, np.uint64)  # its bucket, then its cell
    # A lookup is three dependent reads (locator words, bucket seed, cell), each a cache
    # miss in a table the edge has not read lately. Each stage does one of them for
    # every probe: its reads do not wait on each other, so the CPU overlaps their misses
    # (one probe at a time, every miss waited for the one before: ~10x slower cold).
    # Before them, one pass asks for all the lines any stage may read, so that even the
    # misses of the dependent stages overlap (1.3-1.4x faster in the simulator).
    for i in range(n):
        at = probes[i, 0]
        if at >= n_keys:
            continue
        key = np.uint64(keys[at])
        shard = np.int64(_mix64(key ^ _SALT) % n_shards)
        touched[shard] = 1
        rows[i] = shard * n_tables + probes[i, 1]
        _prefetch_lookup(desc[rows[i]], key)
    for i in range(n):
        if rows[i] >= 0:
            where[i] = _bucket(desc[rows[i]], np.uint64(keys[probes[i, 0]]))
    for i in range(n):
        if rows[i] >= 0:
            where[i] = _cell(desc[rows[i]], np.uint64(keys[probes[i, 0]]), where[i])
    for i in range(n):
        if rows[i] < 0:
            continue
        table = probes[i, 1]
        value = _value(desc[rows[i]], np.uint64(keys[probes[i, 0]]), where[i])
        after = probes[i, 3]
        field = 0
        while value:
            tier = np.int64(value & _U3)
            if tier:
                w = workers[table, field]
                if after == UNCHECKED or lengths[w] == after:
                    lengths[w] = probes[i, 2]
                    tiers[w] = tier
            value >>= _U2
            field += 1
    for w in range(len(lengths)):
        if lengths[w] < 0:  # a guard's mark that no row extended
            lengths[w] = 0
            tiers[w] = 0


def describe(row: NDArray[np.uint64], base: int, g: TableGeometry, layout: ImageLayout) -> None:
    """Fill one descriptor row for a view image mapped at address ``base``."""
    row[_SEEDS] = base + layout.seeds
    row[_CELLS] = base + layout.cells
    row[_WORDS] = base + layout.words
    row[_FPS] = base + layout.fingerprints if layout.fingerprint_itemsize else 0
    row[_CELL_BYTES] = layout.cell_itemsize
    row[_NB], row[_MA], row[_MB] = g.nb, g.ma, g.mb
    row[_BSEED], row[_OSEED], row[_SSEED] = g.bucket_seed, g.othello_seed, g.slot_seed
    row[_FSEED] = g.fingerprint_seed
    row[_FSHIFT] = 64 - g.fingerprint_bits


def table_workers(tables: list[tuple[int, ...]]) -> NDArray[np.int64]:
    """``workers[table, field]``: each table's field owners, padded with -1."""
    width = max((len(t) for t in tables), default=0)
    out = np.full((len(tables), max(width, 1)), -1, dtype=np.int64)
    for i, members in enumerate(tables):
        out[i, : len(members)] = members
    return out


def warm_up() -> None:
    """Compile (first run on a machine, ~20 s) or load the kernel's C entry (~0.3 s)
    now, so that a router's first request does not pay for it."""
    from kvcompass.index import probe_call  # its entry imports this module

    empty = np.zeros(1, np.int64)
    probe_call.match(
        np.zeros((1, N_COLUMNS), np.uint64),
        1,
        np.zeros(0, np.int64),
        np.zeros((0, 4), np.int64),
        table_workers([(0,)]),
        empty,
        empty.copy(),
        np.zeros(1, np.uint8),
    )
