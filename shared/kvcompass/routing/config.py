"""Routing knobs: the paper's defaults (§3.4, §5.1) and the constants it leaves open.

The three the paper does not fix, and why we chose these values:

- ``tau_ms`` (τ, the capacity price's normaliser): λ = min(λmax, min_r T̂q(r)/τ), so τ is
  the shortest queue at which recomputing a token costs double. Our reading of the paper
  (``PAPER_PRICE``) sets it to the prefill of one typical request: 4,096 tokens x β =
  0.085 ms/token (RTX 5090, Llama-3.1-8B) ≈ 350 ms, so λ ≈ 1 when even the least-loaded
  worker has one request's worth of work waiting and λmax = 8 is reached at about eight.
  The router ships a steeper price (see ``tau_ms`` and ``lambda_max`` below).
- ``belief_weight`` (α of the belief EWMA b ← (1-α)·b + α·reused/claimed): 0.2. One false
  claim (a Ludo false locator, 0.1-1.3 % of lookups in the paper's Table 5) costs a true
  holder only a fifth of its credit, while a worker whose claims are all false falls
  below b = 0.5 after four responses and below 0.11 after ten.
- ``idle_for_s`` (how long a migration target's queue estimate must have stayed at 0):
  1.0 s, the hot window T_h: the target has been idle for as long as the family took to
  turn hot, i.e. through at least ten broadcast periods Δ for a remote region.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

__all__ = [
    "PAPER_PRICE",
    "Ablations",
    "CapacityPrice",
    "RoutingConfig",
    "ShippedChoices",
    "routing_config",
]


class CapacityPrice(TypedDict):
    """τ (ms) and λmax of the capacity price, as ``RoutingConfig`` names them."""

    tau_ms: float
    lambda_max: float


#: The capacity price of the paper's evaluation: its λmax (§5.1) and our reading of its
#: τ, which it leaves open (see the module docstring). The reports' paper cells pin it.
PAPER_PRICE = CapacityPrice(tau_ms=350.0, lambda_max=8.0)


@dataclass(frozen=True)
class Ablations:
    """Switches for the paper's Fig. 15 ablations; each removes exactly one term."""

    #: False: T̂q(r) and λ are taken as 0 (the score ignores load).
    load_aware: bool = True
    #: False: matches in other regions count as 0 (only local holders are reused).
    xregion_reuse: bool = True
    #: False: the DRAM reload term γ·b·m is dropped (a DRAM hit looks like a VRAM hit).
    tier_aware: bool = True
    #: False: no hot-prefix migration orders.
    migration: bool = True


@dataclass(frozen=True)
class RoutingConfig:
    #: Δ: period of a region's queue broadcast to the other regions (s).
    broadcast_period_s: float = 0.1
    #: w: EWMA weight of a queue vector piggybacked on a cross-region response.
    piggyback_weight: float = 0.5
    #: Beyond the paper (``PAPER_PRICE``: τ 350 ms, λmax 8), a steeper capacity price:
    #: τ (ms) and the cap λmax. λ stays 0 while any worker's queue estimate is 0, reaches 1
    #: once the least-loaded worker has 10 ms queued and the cap at 0.8 s. With the
    #: paper's price a saturated pool still trades a second of queue for a few hundred
    #: recomputed tokens (λ ≤ 8): agent turns leave the worker that is about to hold
    #: their previous turn, and the extra prefill is what the pool lacks. Over Figs. 12
    #: and 16's 42 points, with the three switches below, the steeper price gave the
    #: lowest P99 TTFT of all schemes at 41 (40 with the paper's price) and the highest
    #: throughput at 41 (40); it raised sim-8region Mixed at 3 λ0 from 250 to 276 req/s
    #: (PlanetServe 270), and lost no point (``kvcompass report shipped-grid``;
    #: ``loadgen/reports/README.md``, "The capacity price as shipped").
    tau_ms: float = 10.0
    lambda_max: float = 80.0
    #: H: local misses of a prefix family within ``hot_window_s`` that make it hot.
    hot_misses: int = 3
    #: T_h (s): the sliding window of those misses.
    hot_window_s: float = 1.0
    #: α of the cache-belief EWMA; see the module docstring.
    belief_weight: float = 0.2
    #: A migration target's queue estimate must have been 0 for this long (s).
    idle_for_s: float = 1.0
    #: Next-best workers a decision names for a retry.
    fallbacks: int = 2
    #: Prefix families the hot tracker remembers (least recently missed ones go first).
    max_families: int = 65_536
    #: Beyond the paper (0: its score): round trips KVCompass's score adds to a worker in
    #: another region. That worker's queue estimate is at least a report period and a WAN
    #: crossing old, and the other regions' edges may pick the same worker meanwhile (the
    #: herding window), so the estimate runs low where it decides. The default, 1.0,
    #: charges a remote worker two round trips: over Figs. 12 and 16's 42 points it gave
    #: the lowest P99 TTFT of all schemes at 33 against the paper score's 26, and lost none
    #: (the margin-grid report, now ``kvcompass report shipped-grid``;
    #: ``loadgen/reports/README.md``). The paper's evaluation pins 0.
    remote_margin_rtt: float = 1.0
    #: Beyond the paper (False: its score): credit the prefixes this edge has sent to a
    #: worker of its own region until the index reports them
    #: (:mod:`kvcompass.routing.pending`). In overload a new prefix family otherwise
    #: lands on a new worker per request for a whole queue wait. Over Figs. 12 and 16's
    #: 42 points, with the margin, it gave the lowest P99 TTFT of all schemes at 35
    #: against the margin's 33 and the paper score's 26 (``kvcompass report
    #: shipped-grid``). The paper's evaluation pins False.
    pending_credit: bool = True
    #: How long past the queue estimate it routed on a sent prefix stays credited (s): the
    #: index's lag and the estimate's error (0.1, 0.5 and 2 s measured alike at 3 λ0).
    pending_slack_s: float = 0.5
    #: Beyond the paper (False: its lookup): a worker's hit at an indexed length counts
    #: only if it also hit at the previous length queried in its region, or, at a
    #: region's first queried length, at the guard: the longest length the region
    #: registers below it (hashed and probed, never credited). A worker that holds a
    #: prefix holds every shorter one, so a hit that breaks the chain is a false
    #: locator: a never-inserted key (most of a long prompt's) landing on an occupied
    #: Ludo cell. Costs no memory (``kvcompass.index.probe.match_probes``). On Fig. 12's
    #: cells it cut the requests sent on a false claim from 2.3-5.1 % to 0.07-1.0 %
    #: (Mixed), and with the margin and pending credit KVCompass had the lowest P99 TTFT
    #: of all schemes at 40 of Figs. 12 and 16's 42 points (35 without it; ``kvcompass
    #: report shipped-grid`` and ``table5``). The guard took Mixed at 2-3 λ0 with the
    #: steeper price from 1.3-1.6 % to 0.22-0.46 %. The paper's evaluation pins False.
    prefix_chain: bool = True
    ablations: Ablations = field(default_factory=Ablations)

    def __post_init__(self) -> None:
        """ValueError naming the first setting out of its range, with its value."""
        # Written as "not in range", so that NaN fails every check.
        ranges: tuple[tuple[tuple[str, ...], Callable[[float], bool], str], ...] = (
            (("broadcast_period_s", "hot_window_s", "tau_ms"), lambda v: v > 0, "positive"),
            (("piggyback_weight", "belief_weight"), lambda v: 0 < v <= 1, "in (0, 1]"),
            (
                ("lambda_max", "idle_for_s", "remote_margin_rtt", "pending_slack_s"),
                lambda v: v >= 0,
                ">= 0",
            ),
            (("hot_misses", "max_families"), lambda v: v >= 1, ">= 1"),
            (("fallbacks",), lambda v: v >= 0, ">= 0"),
        )
        for names, fits, wanted in ranges:
            for name in names:
                value = getattr(self, name)
                if not fits(value):
                    raise ValueError(f"{name} must be {wanted}, got {value}")
                # Infinity fits most ranges and means none of them: an infinite margin
                # times a local worker's 0 made its score NaN.
                if not math.isfinite(value):
                    raise ValueError(f"{name} must be finite, got {value}")


class ShippedChoices(Protocol):
    """The five settings in which KVCompass as shipped departs from the paper's
    evaluation, as every layer that exposes them names them: the router's settings, a
    simulator cell, a demo's recorded scenario."""

    @property
    def remote_margin_rtt(self) -> float: ...
    @property
    def pending_credit(self) -> bool: ...
    @property
    def prefix_chain(self) -> bool: ...
    @property
    def tau_ms(self) -> float: ...
    @property
    def lambda_max(self) -> float: ...


def routing_config(choices: ShippedChoices, **fields: Any) -> RoutingConfig:
    """A RoutingConfig with ``choices``' five settings and any other ``fields``."""
    return RoutingConfig(
        remote_margin_rtt=choices.remote_margin_rtt,
        pending_credit=choices.pending_credit,
        prefix_chain=choices.prefix_chain,
        tau_ms=choices.tau_ms,
        lambda_max=choices.lambda_max,
        **fields,
    )
