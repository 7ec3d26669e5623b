"""Latency of the routing core's per-request decision, split into its parts.

Usage: python bench/routing_decide.py [--quick] [--prompt-tokens N] [--no-policies]

Prints one JSON object: for testbed-3region (14 workers), sim-8region (64) and
sim-16region (128), the P50 / P99 of a whole ``decide`` (keys + lookup of every level
toward every region + joint score + ranking + the decision object) for prompts of 4,096
tokens over an in-process DiscoveryView holding a few thousand prefixes, and, measured
interleaved on the same requests, the keys alone, the lookup alone and the policy alone
(``score_*``: ``decide`` with each request's keys and matches precomputed, i.e. the
joint score, the ranking, the hot-family bookkeeping and the decision object). Decisions
run with the default config (migration on).

Then, on sim-8region, ``decide`` of every policy of ``make_policy`` over the same index
and requests (``policies_sim-8region``: P50 / P99 µs), measured interleaved (policy by
policy on each request) so machine load weighs on all of them alike; "oracle" and
"central-directory" read a WorldView of idle queues, as the simulator would pass.

The shared-memory reader's figures are bench/routing.py's (the perf helper's): it can
call :func:`decide_samples_us` with a policy built over a ``SharedIndexReader``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from kvcompass.index.discovery import Match, MultiLevelQuery
from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import POLICY_NAMES, KVCompassPolicy, RouteRequest, make_policy
from kvcompass.routing.testing import RealIndex, request, tokens
from kvcompass.topology import load_builtin

TOPOLOGIES = ("testbed-3region", "sim-8region", "sim-16region")


def decide_samples_us(policy: KVCompassPolicy, requests: Sequence[RouteRequest]) -> list[float]:
    """One ``decide`` per request, timed one by one (µs), GC paused like a warm server."""
    samples = []
    gc.collect()
    gc.disable()
    try:
        for r in requests:
            t0 = time.perf_counter_ns()
            policy.decide(r)
            samples.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        gc.enable()
    return samples


class _Replay:
    """Stands for the query planner and the reader with answers computed beforehand."""

    def __init__(self) -> None:
        self.queries: dict[int, MultiLevelQuery] = {}
        self.matches: dict[int, Match] = {}

    def query(self, toks: object) -> MultiLevelQuery:
        return self.queries[id(toks)]

    def match(self, query: MultiLevelQuery) -> Match:
        return self.matches[id(query)]

    def ready(self) -> bool:
        return True


def _pct(xs: list[float], q: float) -> float:
    return round(statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1], 2)


def bench_topology(name: str, n_prompts: int, rounds: int, prompt_tokens: int) -> dict[str, Any]:
    topology = load_builtin(name)
    origin = topology.regions[0].name
    index = RealIndex(topology)
    prompts = [tokens(prompt_tokens, seed=s) for s in range(n_prompts)]
    n = len(topology.workers)
    for i, prompt in enumerate(prompts[: n_prompts // 2]):  # half the prompts have holders
        for j in range(3):
            index.set((i * 7 + j * 5) % n, prompt, upto=prompt_tokens // (j + 1), tier=Tier.VRAM)
    policy = make_policy("kvcompass", topology, origin, index.view, clock=ManualClock())
    assert isinstance(policy, KVCompassPolicy)
    requests = [request(p, origin=origin) for p in prompts]
    planner = policy._planners.planner(requests[0].namespace)
    replay = _Replay()
    for r in requests:
        query = replay.queries[id(r.tokens)] = planner.query(r.tokens)
        replay.matches[id(query)] = index.view.match(query)
    scorer = make_policy("kvcompass", topology, origin, replay, clock=ManualClock())
    assert isinstance(scorer, KVCompassPolicy)
    scorer._planners._by_namespace[requests[0].namespace] = replay  # type: ignore[assignment]
    keys, lookup, score, decide = [], [], [], []
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for r in requests:
                query = replay.queries[id(r.tokens)]
                t0 = time.perf_counter_ns()
                planner.query(r.tokens)
                t1 = time.perf_counter_ns()
                index.view.match(query)
                t2 = time.perf_counter_ns()
                scorer.decide(r)
                t3 = time.perf_counter_ns()
                policy.decide(r)
                t4 = time.perf_counter_ns()
                keys.append((t1 - t0) / 1000)
                lookup.append((t2 - t1) / 1000)
                score.append((t3 - t2) / 1000)
                decide.append((t4 - t3) / 1000)
    finally:
        gc.enable()
    med = statistics.median
    return {
        "workers": n,
        "decision_p50_us": _pct(decide, 50),
        "decision_p99_us": _pct(decide, 99),
        "keys_p50_us": round(med(keys), 2),
        "lookup_p50_us": round(med(lookup), 2),
        "score_p50_us": round(med(score), 2),
        "score_p99_us": _pct(score, 99),
        "samples": len(decide),
    }


class _IdleWorld:
    def queue_ms(self, worker: int) -> float:
        return 0.0


def bench_policies(name: str, n_prompts: int, rounds: int, prompt_tokens: int) -> dict[str, Any]:
    """P50 / P99 µs of ``decide`` per policy name, interleaved over the same requests."""
    topology = load_builtin(name)
    origin = topology.regions[0].name
    index = RealIndex(topology)
    prompts = [tokens(prompt_tokens, seed=s) for s in range(n_prompts)]
    n = len(topology.workers)
    for i, prompt in enumerate(prompts[: n_prompts // 2]):
        for j in range(3):
            index.set((i * 7 + j * 5) % n, prompt, upto=prompt_tokens // (j + 1), tier=Tier.VRAM)
    policies = {
        p: make_policy(p, topology, origin, index.view, clock=ManualClock(), world=_IdleWorld())
        for p in POLICY_NAMES
    }
    requests = [request(p, origin=origin) for p in prompts]
    samples: dict[str, list[float]] = {p: [] for p in policies}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for r in requests:
                for p, policy in policies.items():
                    t0 = time.perf_counter_ns()
                    policy.decide(r)
                    samples[p].append((time.perf_counter_ns() - t0) / 1000)
    finally:
        gc.enable()
    return {p: {"p50_us": _pct(xs, 50), "p99_us": _pct(xs, 99)} for p, xs in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (~10 s)")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument(
        "--no-policies", action="store_true", help="skip the per-policy decide() comparison"
    )
    args = parser.parse_args()
    rounds = 5 if args.quick else 30
    result: dict[str, Any] = {
        "prompt_tokens": args.prompt_tokens,
        "reader": "in-process DiscoveryView",
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    for name in TOPOLOGIES:
        result[name] = bench_topology(name, 200, rounds, args.prompt_tokens)
    if not args.no_policies:
        result["policies_sim-8region"] = bench_policies(
            "sim-8region", 200, rounds, args.prompt_tokens
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
