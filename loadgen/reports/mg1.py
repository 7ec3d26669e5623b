"""The M/G/1 mean queueing delay (Pollaczek–Khinchine), paper §3.5 and Fig. 9.

With Poisson arrivals at rate a and service time S: E[Tq] = a·E[S²] / (2(1 − ρ)),
ρ = a·E[S]; infinite at ρ ≥ 1. Random forwarding over W workers gives each worker a
Poisson stream of rate λ/W, so the pool's mean wait is the arrival-weighted mean of the
workers' (each with its own service moments: regions differ in prefill speed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["pk_mean_wait_ms", "random_pool_wait_ms"]


def pk_mean_wait_ms(rate_per_s: float, mean_s_ms: float, mean_s2_ms2: float) -> float:
    """Mean wait in queue (ms) of an M/G/1 queue; ``inf`` when it is unstable."""
    a = rate_per_s / 1e3  # arrivals per ms
    rho = a * mean_s_ms
    if rho >= 1:
        return math.inf
    return a * mean_s2_ms2 / (2 * (1 - rho))


def random_pool_wait_ms(rate_per_s: float, moments: Sequence[tuple[float, float]]) -> float:
    """Mean wait when ``rate_per_s`` is split uniformly at random over workers with
    service moments ``(E[S], E[S²])`` each (ms, ms²)."""
    share = rate_per_s / len(moments)
    return sum(pk_mean_wait_ms(share, es, es2) for es, es2 in moments) / len(moments)
