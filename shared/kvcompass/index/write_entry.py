"""The write kernel as a C function, for compiled callers.

A numba call from Python unboxes each argument (about 1.3 µs for the kernel's eight
when they are cold, as between two flushes of one table), and the numpy arrays it takes
cost a staging buffer three more to make per table. A maintenance unit's flush instead
hands the kernel a table's staged columns by address, from C
(:mod:`kvcompass.index.write_call`), through this C entry point: one ``cfunc`` that
wraps the described arrays and runs :func:`~kvcompass.index.kernel.apply_writes` for the
table's cell and fingerprint widths (four compiled versions, one function).

Importing this module compiles the entry (or loads it from numba's on-disk cache), so
only the code that writes through it imports it, on first use.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import carray, types  # type: ignore[attr-defined]

from kvcompass.index.addresses import address
from kvcompass.index.kernel import DESCRIPTOR_LENGTH, GEOMETRY_LENGTH, apply_writes

__all__ = ["write_at_address"]

_SIGNATURE = types.int64(
    types.uint64,  # the table's write descriptor
    types.uint64,  # its cells
    types.int64,  # their bytes each (4 or 8)
    types.uint64,  # its fingerprints (or the scratch row that stands in for them)
    types.int64,  # their bytes each (1 or 2)
    types.uint64,  # its geometry vector
    types.uint64,  # the keys to write
    types.uint64,  # their clear masks
    types.uint64,  # their bits
    types.int64,  # how many
    types.int64,  # the first to write
)


@numba.njit(cache=True)
def _with_fingerprints(
    desc: Any, cells: Any, fps_at: Any, fp_bytes: Any, columns: Any
) -> tuple[Any, Any]:
    """:func:`apply_writes` with the fingerprints at ``fps_at`` wrapped at their width
    (compiled once per cell type)."""
    geo, keys, clear, bits, start = columns
    if fp_bytes == 2:
        fps2 = carray(address(fps_at), len(cells), np.uint16)
        return apply_writes(desc, cells, fps2, geo, keys, clear, bits, start)
    fps1 = carray(address(fps_at), len(cells), np.uint8)
    return apply_writes(desc, cells, fps1, geo, keys, clear, bits, start)


@numba.cfunc(_SIGNATURE, cache=True)
def _write_at(
    desc_at: Any,
    cells_at: Any,
    cell_bytes: Any,
    fps_at: Any,
    fp_bytes: Any,
    geo_at: Any,
    keys_at: Any,
    clear_at: Any,
    bits_at: Any,
    n: Any,
    start: Any,
) -> Any:
    """:func:`apply_writes` over arrays given by address: returns ``status << 32 |
    index`` (index < 2^32: a flush stages far fewer writes)."""
    desc = carray(address(desc_at), DESCRIPTOR_LENGTH, np.uint64)
    n_cells = desc[1]  # the per-cell key array's length
    geo = carray(address(geo_at), GEOMETRY_LENGTH, np.uint64)
    keys = carray(address(keys_at), n, np.uint64)
    clear = carray(address(clear_at), n, np.uint64)
    bits = carray(address(bits_at), n, np.uint64)
    columns = (geo, keys, clear, bits, start)
    if cell_bytes == 4:
        cells4 = carray(address(cells_at), n_cells, np.uint32)
        status, i = _with_fingerprints(desc, cells4, fps_at, fp_bytes, columns)
    else:
        cells8 = carray(address(cells_at), n_cells, np.uint64)
        status, i = _with_fingerprints(desc, cells8, fps_at, fp_bytes, columns)
    return (np.int64(status) << 32) | np.int64(i)


def write_at_address() -> int:
    """Where the C entry point's machine code starts."""
    return int(_write_at.address)  # type: ignore[arg-type]
