"""The M/G/1 mean queueing delay (Pollaczek–Khinchine), paper §3.5 and Fig. 9.

With Poisson arrivals at rate a and service time S: E[Tq] = a·E[S²] / (2(1 − ρ)),
ρ = a·E[S]; infinite at ρ ≥ 1. Random forwarding over W workers gives each worker a
Poisson stream of rate λ/W.
"""

from __future__ import annotations

import math

__all__ = ["pk_mean_wait_ms"]


def pk_mean_wait_ms(rate_per_s: float, mean_s_ms: float, mean_s2_ms2: float) -> float:
    """Mean wait in queue (ms) of an M/G/1 queue; ``inf`` when it is unstable."""
    a = rate_per_s / 1e3  # arrivals per ms
    rho = a * mean_s_ms
    if rho >= 1:
        return math.inf
    return a * mean_s2_ms2 / (2 * (1 - rho))
