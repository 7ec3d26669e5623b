"""Table 5: false hits of the keyless view on small indexes, and end-to-end false lookups."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvcompass.loadgen.reports.table5 import false_hit_rate, false_lookup_share, run_table5


@pytest.mark.parametrize("target_load", [0.5, 0.9])
def test_without_fingerprints_a_never_inserted_key_hits_an_occupied_cell(
    target_load: float,
) -> None:
    # The view answers whatever sits in the one cell a key maps to, so the false-hit
    # rate is the occupied share of cells (within 4 binomial sigmas).
    capacity, queries = 4000, 40_000
    n_cells = 4 * math.ceil(capacity / (4 * 0.95))
    n_keys = round(target_load * n_cells)
    rate, hits = false_hit_rate(n_keys, capacity, 0, queries, seed=1)
    load = n_keys / n_cells
    assert hits == round(rate * queries)
    assert abs(rate - load) < 4 * math.sqrt(load * (1 - load) / queries)


def test_fingerprints_cut_false_hits_by_their_width() -> None:
    capacity, queries = 4000, 40_000
    n_keys = 3600
    plain, _ = false_hit_rate(n_keys, capacity, 0, queries, seed=2)
    eight, hits8 = false_hit_rate(n_keys, capacity, 8, queries, seed=2)
    sixteen, hits16 = false_hit_rate(n_keys, capacity, 16, queries, seed=2)
    # Load 3600 / 4212 cells ≈ 0.85: 8-bit hits ≈ 40,000 × 0.85 / 256 ≈ 134 (sd ≈ 12),
    # 16-bit ≈ 0.5.
    assert 90 < hits8 < 200
    assert hits16 <= 5
    assert eight < plain / 100
    assert sixteen < eight


def test_false_lookups_count_claims_the_worker_did_not_hold() -> None:
    matched = np.array([0, 1024, 1024, 512, 2048])
    reused = np.array([0, 1024, 256, 512, 0])
    # Four requests claimed a match; two got less than claimed.
    assert false_lookup_share(matched, reused) == pytest.approx(0.5)
    assert false_lookup_share(np.zeros(3), np.zeros(3)) == 0.0


def test_run_writes_png_and_csv(tmp_path: Path) -> None:
    art = run_table5(tmp_path, capacity=2000, queries=5000, loads=(0.5, 0.9), fingerprints=(0, 8))
    assert (tmp_path / "table5.png").stat().st_size > 0
    header = (tmp_path / "table5.csv").read_text().splitlines()[0].split(",")
    assert header == list(art.columns)
    assert len(art.rows) == 4
