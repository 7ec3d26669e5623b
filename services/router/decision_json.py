"""``POST /v1/route``'s answer: a Decision with every candidate's score terms."""

from __future__ import annotations

import math
from typing import Any

from kvcompass.services.router.policy import Candidate, Decision
from kvcompass.topology import Topology

__all__ = ["decision_json"]


def _ms(value: float) -> float | None:
    """JSON has no infinity: a worker marked down (infinite queue) reads as null."""
    return value if math.isfinite(value) else None


def _candidate(c: Candidate) -> dict[str, Any]:
    return {
        "worker": c.worker_id,
        "index": c.worker,
        "region": c.region,
        "down": not math.isfinite(c.queue_ms),
        "score_ms": _ms(c.score),
        "wan_ms": c.wan_ms,
        "queue_ms": _ms(c.queue_ms),
        "prefill_ms": c.prefill_ms,
        "reload_ms": c.reload_ms,
        "matched_tokens": c.matched_tokens,
        "tier": c.tier.name.lower(),
        "belief": c.belief,
        "pending": c.pending,
    }


def decision_json(
    decision: Decision,
    topology: Topology,
    *,
    policy: str,
    origin: str,
    namespace: str,
    prompt_tokens: int,
    decide_us: float,
) -> dict[str, Any]:
    migration = decision.migration
    return {
        "policy": policy,
        "origin_region": origin,
        "namespace": namespace,
        "prompt_tokens": prompt_tokens,
        "worker": decision.worker_id,
        "index": decision.worker,
        "region": decision.region,
        "reason": decision.reason,
        "claimed_tokens": decision.claimed_tokens,
        "lambda": _ms(decision.lam),
        "decide_us": decide_us,
        "lookup_ms": _ms(decision.lookup_ms),
        "fallbacks": [topology.workers[i].id for i in decision.fallbacks],
        "migration": None
        if migration is None
        else {
            "prefix_tokens": migration.prefix_tokens,
            "target": topology.workers[migration.target_worker].id,
            "source": None
            if migration.source_worker is None
            else topology.workers[migration.source_worker].id,
            "mode": migration.mode,
        },
        "candidates": [_candidate(c) for c in decision.candidates],
    }
