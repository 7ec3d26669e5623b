"""Table 5: structural false hits of the keyless Ludo view, by table load.

The edge view stores no keys, so a never-inserted key lands on some cell and returns
whatever value sits there: a false locator whenever that cell is occupied. Per-cell
fingerprints (``[index] fingerprint_bits`` in the topology, 0 in the paper; the view then
answers 0 on a mismatch) cut the rate by about 2^-bits. We build one table per load with
the maintenance side's bulk build, derive its view image, and query fresh random keys.

The end-to-end rate (how often the worker a real request was sent to lacks the claimed
match) needs routed requests: :func:`false_lookup_share` reads it off simulator records.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from kvcompass.index.ludo import LudoTable
from kvcompass.index.view import LudoView
from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.sim.cell import Cell

__all__ = ["end_to_end", "false_hit_rate", "false_lookup_share", "run_table5"]

LOADS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
FINGERPRINTS = (0, 8, 16)
COLUMNS = ("load", "fingerprint_bits", "keys", "queries", "false_hits", "false_hit_rate")


def false_hit_rate(
    n_keys: int, capacity: int, fingerprint_bits: int, queries: int, seed: int
) -> tuple[float, int]:
    """(false-hit rate, achieved load %) of a view holding ``n_keys`` random keys in a
    table sized for ``capacity`` keys at 95% cells, queried with never-inserted keys."""
    rng = np.random.default_rng(seed)
    # 63-bit keys; the queries come from the other half of the key space, so none of
    # them was inserted.
    keys = rng.choice(1 << 62, size=n_keys, replace=False).astype(np.uint64)
    values = rng.integers(1, 1 << 32, size=n_keys, dtype=np.uint64)
    table = LudoTable.build(
        keys,
        values,
        capacity=capacity,
        value_bits=32,
        fingerprint_bits=fingerprint_bits,
        rng=random.Random(seed),
    )
    view = LudoView(table.view_image())
    alien = rng.integers(1 << 62, 1 << 63, size=queries, dtype=np.uint64)
    hits = int(np.count_nonzero(view.lookup_batch(alien)))
    return hits / queries, hits


def false_lookup_share(matched: NDArray[Any], reused: NDArray[Any]) -> float:
    """Share of requests with a claimed match whose chosen worker reused less than it."""
    claimed = matched > 0
    n = int(np.count_nonzero(claimed))
    return int(np.count_nonzero(reused[claimed] < matched[claimed])) / n if n else 0.0


def _figure(rows: Sequence[dict[str, float]]) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for bits in sorted({int(r["fingerprint_bits"]) for r in rows}):
        pts = [(r["load"], r["false_hit_rate"]) for r in rows if r["fingerprint_bits"] == bits]
        x, y = zip(*pts, strict=True)
        ax.plot(x, [100 * v for v in y], marker="o", label=f"{bits}-bit fingerprints")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("table load (occupied share of cells)")
    ax.set_ylabel("false hits, never-inserted keys (%)")
    ax.set_title("Structural false hits of the keyless view")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: the lines fill them
    return fig


def run_table5(
    out: Path,
    *,
    capacity: int = 200_000,
    queries: int = 500_000,
    loads: Sequence[float] = LOADS,
    fingerprints: Sequence[int] = FINGERPRINTS,
    seed: int = 5,
) -> Artefact:
    art = Artefact("table5", COLUMNS)
    n_cells = LudoTable.with_capacity(capacity).geometry.n_cells
    for bits in fingerprints:
        for load in loads:
            n_keys = min(round(load * n_cells), capacity)
            rate, hits = false_hit_rate(n_keys, capacity, bits, queries, seed)
            art.rows.append(
                {
                    "load": round(n_keys / n_cells, 4),
                    "fingerprint_bits": bits,
                    "keys": n_keys,
                    "queries": queries,
                    "false_hits": hits,
                    "false_hit_rate": rate,
                }
            )
    art.meta = {
        "cells": n_cells,
        "value_bits": 32,
        "expected": "≈ load × 2^-fingerprint_bits (an occupied cell, and a fingerprint match)",
        "paper_95pct_load_no_fingerprints": 0.453,
    }
    art.write(out, _figure(art.rows))
    return art


def end_to_end(out: Path, quick: bool) -> str:
    """The end-to-end false-lookup rate of KVCompass's runs in ``out/grid``: Fig. 12's
    cells (the paper's lookup: run ``report fig12`` first) and, where ``report
    shipped-grid`` ran in the same ``--out``, KVCompass as shipped, whose prefix chain
    turns most false locators away. This report simulates nothing itself."""
    from kvcompass.loadgen.reports.cells import WORKLOADS
    from kvcompass.loadgen.reports.fig12 import SCALES, cells
    from kvcompass.loadgen.reports.shipped_grid import SHIPPED

    lines = []
    for cell in cells(SCALES["fig12"], quick, WORKLOADS):
        if cell.policy != "kvcompass":
            continue
        paper, shipped = _false_lookups(out, cell), _false_lookups(out, replace(cell, **SHIPPED))
        if paper is None:
            continue
        line = f"  {cell.workload:<9} {cell.rate:>7g} req/s: {100 * paper:5.2f} %"
        lines.append(line + ("" if shipped is None else f"  {100 * shipped:5.2f} %"))
    if not lines:
        return "end-to-end false lookups: no fig12 runs in this --out yet"
    head = (
        "end-to-end false lookups, KVCompass on sim-8region: % of requests with a claimed "
        "match whose worker reused less; the paper's lookup, then as shipped (prefix chain)"
    )
    return "\n".join([head, *lines])


def _false_lookups(out: Path, cell: Cell) -> float | None:
    from kvcompass.loadgen.reports.runs import load_run
    from kvcompass.loadgen.sim.grid import done_summary

    folder = out / "grid" / cell.key
    if done_summary(folder, cell) is None:
        return None
    req = load_run(folder).requests
    return false_lookup_share(req["matched_tokens"], req["reused_tokens"])
