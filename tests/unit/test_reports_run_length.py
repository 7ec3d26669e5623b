"""``kvcompass report run-length``: every scheme's P99 TTFT over KVCompass's, per run length."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcompass.loadgen.reports import fig12, run_length
from kvcompass.loadgen.reports.cells import paper_cell, rates_of
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.sim.cell import Cell

SCALE = run_length.SCALE
RATE = rates_of(SCALE.topology, [SCALE.focus])[0]


def _run(p99: float, compute_ms: float, window_s: float) -> Run:
    """Two requests on one worker, ``window_s`` apart, with ``compute_ms`` of prefill."""
    summary = {
        "ttft_p99_ms": p99,
        "throughput_req_per_s": 100.0,
        "peak_load_factor": 1.1,
        "n_workers": 64,
    }
    requests = {
        "ttft_ms": np.zeros(2),
        "worker": np.array(["us-0", "us-0"]),
        "worker_region": np.array(["us", "us"]),
        "arrival_s": np.array([0.0, window_s]),
        "prefill_ms": np.array([compute_ms / 2, compute_ms / 2]),
        "reload_ms": np.zeros(2),
    }
    return Run(summary, {}, requests, {})


def test_each_ratio_is_over_kvcompass_at_the_same_length_and_rows_run_short_to_long() -> None:
    def cell(policy: str, n: int) -> Cell:
        return paper_cell(policy, RATE, 0, topology=SCALE.topology, requests=n)

    runs = {
        cell("skywalker", 60_000): _run(16_000.0, 64 * 2_000.0, 2.0),  # busy 2000/2000 ms
        cell("oracle", 6_000): _run(10_000.0, 1.0, 1.0),
        cell("kvcompass", 60_000): _run(4_000.0, 1.0, 1.0),
        cell("skywalker", 6_000): _run(6_000.0, 1.0, 1.0),
        cell("kvcompass", 6_000): _run(3_000.0, 1.0, 1.0),
    }
    rows = run_length.tabulate(runs)
    assert [(r["policy"], r["requests"]) for r in rows] == [
        ("kvcompass", 6_000),
        ("kvcompass", 60_000),
        ("skywalker", 6_000),
        ("skywalker", 60_000),
        ("oracle", 6_000),  # the policies' own order, KVCompass first
    ]
    by = {(r["policy"], r["requests"]): r for r in rows}
    assert by["skywalker", 6_000]["p99_over_kvc"] == pytest.approx(2.0)
    assert by["skywalker", 60_000]["p99_over_kvc"] == pytest.approx(4.0)
    assert by["kvcompass", 60_000]["p99_over_kvc"] == pytest.approx(1.0)
    assert by["skywalker", 60_000]["paper_p99_over_kvc"] == fig12.PAPER_RATIOS["skywalker"]
    assert math.isnan(by["oracle", 6_000]["paper_p99_over_kvc"])  # the paper gives none
    # 128 s of compute, all on one worker, over 64 workers and a 2-s window
    assert by["skywalker", 60_000]["pool_busy"] == pytest.approx(1.0)
    assert by["skywalker", 60_000]["hottest_busy"] == pytest.approx(64.0)
    assert by["skywalker", 60_000]["arrival_window_s"] == pytest.approx(2.0)


def test_the_shortest_runs_are_fig12s_own_cells_at_its_focus_rate() -> None:
    grid = run_length.cells(quick=False)
    shortest = {c for c in grid if c.requests == min(run_length.LENGTHS)}
    focus = fig12.focus_rate(SCALE)
    assert shortest == {c for c in fig12.cells(SCALE, quick=False) if c.rate == focus}
    assert {c.requests for c in grid} == set(run_length.LENGTHS)
    assert max(run_length.LENGTHS) >= 10 * min(run_length.LENGTHS)


def test_quick_runs_three_schemes_at_two_small_lengths() -> None:
    grid = run_length.cells(quick=True)
    assert {c.policy for c in grid} == set(run_length.QUICK_POLICIES)
    assert {c.requests for c in grid} == set(run_length.QUICK_LENGTHS)
    assert len(grid) == len(run_length.QUICK_POLICIES) * len(run_length.QUICK_LENGTHS)
