"""The match kernel as a C function, for compiled callers.

A numba call from Python unboxes each argument: about a microsecond for the match
kernel's eight, on a decision's cold array objects. :mod:`kvcompass.index.probe_call`
takes the same arrays' buffers in C and calls this ``cfunc``, which wraps them and runs
:func:`~kvcompass.index.probe.match_probes`. Importing this module compiles it (or loads
it from numba's on-disk cache), so only the code that matches through it imports it.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import carray, types  # type: ignore[attr-defined]

from kvcompass.index.addresses import address
from kvcompass.index.probe import N_COLUMNS, match_probes

__all__ = ["match_at_address"]

_SIGNATURE = types.void(
    types.uint64,  # descriptor rows (uint64, N_COLUMNS each)
    types.int64,  # how many rows
    types.int64,  # tables per shard
    types.uint64,  # the query's keys (63-bit: int64 or uint64 alike)
    types.int64,  # how many
    types.uint64,  # probe rows (int64, 4 each)
    types.int64,  # how many
    types.uint64,  # workers[table, field] (int64)
    types.int64,  # fields per table
    types.uint64,  # lengths out (int64 per worker)
    types.uint64,  # tiers out (int64 per worker)
    types.int64,  # how many workers
    types.uint64,  # touched out (uint8 per shard)
    types.int64,  # how many shards
)


@numba.cfunc(_SIGNATURE, cache=True)
def _match_at(
    desc_at: Any,
    n_rows: Any,
    n_tables: Any,
    keys_at: Any,
    n_keys: Any,
    probes_at: Any,
    n_probes: Any,
    workers_at: Any,
    n_fields: Any,
    lengths_at: Any,
    tiers_at: Any,
    n_workers: Any,
    touched_at: Any,
    n_shards: Any,
) -> None:
    match_probes(
        carray(address(desc_at), (n_rows, N_COLUMNS), np.uint64),
        n_tables,
        carray(address(keys_at), n_keys, np.int64),
        carray(address(probes_at), (n_probes, 4), np.int64),
        carray(address(workers_at), (n_tables, n_fields), np.int64),
        carray(address(lengths_at), n_workers, np.int64),
        carray(address(tiers_at), n_workers, np.int64),
        carray(address(touched_at), n_shards, np.uint8),
    )


def match_at_address() -> int:
    """Where the C entry point's machine code starts."""
    return int(_match_at.address)  # type: ignore[arg-type]
