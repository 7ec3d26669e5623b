"""The Pollaczek–Khinchine mean wait (paper §3.5) against values worked by hand."""

from __future__ import annotations

import math

import pytest

from kvcompass.loadgen.reports.mg1 import pk_mean_wait_ms, random_pool_wait_ms


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


def test_random_pool_splits_arrivals_evenly() -> None:
    # Two workers at 1000 req/s total: 500 each; one exponential (Wq 1), one
    # deterministic 1 ms (a = 0.5, E[S²] = 1: Wq = 0.5·1/(2·0.5) = 0.5); mean 0.75.
    assert random_pool_wait_ms(1000, [(1.0, 2.0), (1.0, 1.0)]) == pytest.approx(0.75)
