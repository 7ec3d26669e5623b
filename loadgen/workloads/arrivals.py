"""Arrival times: an open-loop Poisson process at a rate, or trace timestamps sped up."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np

__all__ = ["poisson_times", "scaled_times"]


def poisson_times(rate_per_s: float, seed: int) -> Iterator[float]:
    """Arrival times (s from 0) of a Poisson process: exponential gaps of mean 1/rate.
    ValueError at once (not at the first draw) for a rate that is not positive and
    finite: an infinite one would put every arrival at t = 0."""
    if not rate_per_s > 0:
        raise ValueError(f"rate must be positive, got {rate_per_s}")
    if not math.isfinite(rate_per_s):
        raise ValueError(f"rate must be finite, got {rate_per_s}")
    return _poisson(rate_per_s, seed)


def _poisson(rate_per_s: float, seed: int) -> Iterator[float]:
    rng = np.random.default_rng([seed, 0xA11])
    now = 0.0
    while True:
        for gap in rng.exponential(1.0 / rate_per_s, 1024):
            now += float(gap)
            yield now


def scaled_times(timestamps_ms: Iterable[float], speed: float) -> Iterator[float]:
    """Trace timestamps (ms) as seconds from the first one, divided by ``speed``."""
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    first: float | None = None
    for ts in timestamps_ms:
        first = ts if first is None else first
        yield (ts - first) / 1000.0 / speed
