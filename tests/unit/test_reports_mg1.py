"""The Pollaczek–Khinchine mean wait (paper §3.5) against values worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcompass.loadgen.reports.fig9 import tabulate
from kvcompass.loadgen.reports.mg1 import pk_mean_wait_ms
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.sim.cell import Cell


def test_pk_matches_hand_computed_values() -> None:
    # a = 0.5/ms, E[S] = 1 ms, E[S²] = 2 ms² (exponential): ρ = 0.5, Wq = 0.5·2/(2·0.5) = 1.
    assert pk_mean_wait_ms(500, 1.0, 2.0) == pytest.approx(1.0)
    # Deterministic S = 10 ms at 50 req/s: ρ = 0.5, Wq = 0.05·100/(2·0.5) = 5 ms.
    assert pk_mean_wait_ms(50, 10.0, 100.0) == pytest.approx(5.0)
    # ρ = 0.9 with E[S] = 3, E[S²] = 18: a = 0.3/ms, Wq = 0.3·18/(2·0.1) = 27 ms.
    assert pk_mean_wait_ms(300, 3.0, 18.0) == pytest.approx(27.0)


def test_pk_is_infinite_at_and_beyond_saturation() -> None:
    assert math.isinf(pk_mean_wait_ms(1000, 1.0, 2.0))
    assert math.isinf(pk_mean_wait_ms(2000, 1.0, 2.0))


def _run(queue: list[float], prefill: list[float]) -> Run:
    requests = {
        "queue_ms": np.array(queue),
        "prefill_ms": np.array(prefill),
        "reload_ms": np.zeros(len(prefill)),
    }
    return Run(summary={}, config={}, requests=requests, load={})


def test_fig9_curve_uses_the_random_runs_service_moments_split_over_workers() -> None:
    # Random runs: S ∈ {10, 30} ms, so E[S] = 20, E[S²] = 500. At 100 req/s over 4
    # workers a = 0.025/ms, ρ = 0.5 and Wq = 0.025·500/(2·0.5) = 12.5 ms.
    runs = {
        Cell("random", 100.0): _run([1.0, 3.0], [10.0, 30.0]),
        Cell("kvcompass", 100.0): _run([0.5, 0.5], [5.0, 5.0]),
    }
    rows = {str(r["policy"]): r for r in tabulate(runs, workers=4)}
    assert rows["random"]["mg1_ms"] == pytest.approx(12.5)
    assert rows["kvcompass"]["mg1_ms"] == pytest.approx(12.5)  # the curve is the random case
    assert rows["random"]["queue_mean_ms"] == pytest.approx(2.0)
