"""What per-process policy state costs a router group (``KVC_ROUTER_PROCESSES=N``), in
the simulator.

Each edge's policy is split into N independent instances, as the processes of a group
are: the kernel hands each request to one of them at random (SO_REUSEPORT), only that
instance counts the request's pending work and gets its response (belief, piggybacked
queue vector), every instance gets the ``kvc.queues`` broadcasts. Same workload, topology
and seed for every N; one JSON line per N on stdout.

    python bench/router_group_policy.py [--processes 1 2 4] [--rate 40] [--duration 60]

A response is matched to the instance that forwarded its request by (worker, claimed
tokens), first in first out: two requests to one worker with one claim may swap
instances, which changes nothing they teach (same worker, same claim).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict, deque

import numpy as np

from kvcompass.levels import plan_levels
from kvcompass.loadgen.sim.cell import Cell, topology_of
from kvcompass.loadgen.sim.simulator import Simulation
from kvcompass.routing import (
    Decision,
    Feedback,
    RegionQueues,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)


class SplitPolicy:
    """N policy instances behind one edge, as N router processes."""

    def __init__(self, instances: list[RoutingPolicy], seed: int) -> None:
        self.name = instances[0].name
        self._instances = instances
        self._rng = random.Random(seed)
        self._last = 0
        self._sent: dict[tuple[int, int], deque[int]] = defaultdict(deque)
        self.migrations = 0

    def decide(self, request: RouteRequest, explain: bool = False) -> Decision:
        self._last = self._rng.randrange(len(self._instances))
        decision = self._instances[self._last].decide(request, explain)
        self.migrations += decision.migration is not None
        return decision

    def on_forward(self, decision: Decision, expected_service_ms: float) -> None:
        self._sent[(decision.worker, decision.claimed_tokens)].append(self._last)
        self._instances[self._last].on_forward(decision, expected_service_ms)

    def observe(self, feedback: Feedback) -> None:
        sent = self._sent[(feedback.worker, feedback.claimed_tokens)]
        self._instances[sent.popleft()].observe(feedback)

    def on_queues(self, queues: RegionQueues) -> None:
        for instance in self._instances:
            instance.on_queues(queues)

    def on_failure(self, worker: int) -> None:
        self._instances[self._last].on_failure(worker)


def run(options: Cell, processes: int) -> dict[str, float]:
    topology = topology_of(options.topology)
    config = options.sim_config(topology)
    sim = Simulation(config)
    plan = plan_levels(topology)
    split: list[SplitPolicy] = []
    for i, region in enumerate(sim.policies):
        instances: list[RoutingPolicy] = [
            make_policy(
                config.policy,
                topology,
                region,
                sim.index.edges[region],
                config=config.routing,
                clock=sim.clock,
                plan=plan,
                seed=config.seed * 1009 + i + 7919 * p,
                world=sim.pool,
            )
            for p in range(processes)
        ]
        split.append(SplitPolicy(instances, config.seed + i))
        sim.policies[region] = split[-1]
    started = time.perf_counter()
    records = sim.run(options.requests_of(topology)).records
    ttft = np.array([r.ttft_ms for r in records])
    prompt = sum(r.prompt_tokens for r in records)
    return {
        "processes": processes,
        "requests": len(records),
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1),
        "reused_share": round(sum(r.reused_tokens for r in records) / prompt, 4),
        "false_claim_share": round(
            sum(max(0, r.matched_tokens - r.reused_tokens) for r in records)
            / max(1, sum(r.matched_tokens for r in records)),
            4,
        ),
        "cross_region_share": round(
            sum(r.origin != r.worker_region for r in records) / len(records), 4
        ),
        "migrations": sum(p.migrations for p in split),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--topology", default="testbed-3region")
    parser.add_argument("--workload", default="synthetic")
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    options = Cell(
        topology=args.topology,
        workload=args.workload,
        rate=args.rate,
        duration=args.duration,
        seed=args.seed,
    )
    for n in args.processes:
        print(json.dumps(run(options, n)), flush=True)


if __name__ == "__main__":
    main()
