"""What long-context levels cost: index entries and events per admitted prompt, keys per
routed request, with the paper's levels and with ``[index] long_context_levels``.

Usage: python bench/levels.py [--topologies testbed-3region,sim-8region]

Prints one JSON object. For each topology, prompt length (4K, 16K, 64K, 128K tokens) and
level scheme: every worker admits one prompt through a real ``EventPublisher`` (one batch
per shard touched, as a worker sends them), and every edge plans the query of that
prompt. Per admitted prompt: ``entries`` (keys registered = index entries written, one
Ludo slot each), ``events`` (KV events = batches sent, one per shard touched) and the
publisher's time; per request: ``query_keys`` (prefix digests the edge computes),
``probes`` (table lookups) and the time to compute the query with either key hash
(``query_us_sha256``, ``query_us_xxh3``); ``credit`` is the longest indexed length an
edge can credit a whole-prompt match with, toward its own region and toward the
farthest one. Means over workers (admits) and edges (queries).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np

from kvcompass.index.discovery import QueryPlanner
from kvcompass.index.layout import IndexLayout
from kvcompass.keys import KeyHash, Namespace
from kvcompass.levels import plan_levels
from kvcompass.pipeline.clock import ManualClock
from kvcompass.publisher import EventPublisher
from kvcompass.topology import Topology, load_builtin

PROMPT_TOKENS = (4096, 16_384, 65_536, 131_072)
SHARDS = 4  # the services' default (KVC_SHARDS)
NS = Namespace("bench-model")


def _scheme(topology: Topology, long_context: bool) -> Topology:
    return replace(topology, index=replace(topology.index, long_context_levels=long_context))


def _costs(topology: Topology, n_tokens: int, seed: int) -> dict[str, Any]:
    plan = plan_levels(topology)
    layout = IndexLayout.from_topology(topology)
    prompt = np.random.default_rng(seed).integers(0, 128_000, n_tokens, dtype=np.uint32)
    entries, events, admit_us = [], [], []
    for worker in topology.workers:
        publisher = EventPublisher(
            worker, plan, NS, SHARDS, lambda shard, batch: None, clock=ManualClock()
        )
        t0 = time.perf_counter()
        batches = publisher.admit(prompt)
        admit_us.append((time.perf_counter() - t0) * 1e6)
        entries.append(sum(b.n_keys for b in batches))
        events.append(sum(len(b.count_array) for b in batches))
    query_keys, probes, local_credit, far_credit = [], [], [], []
    query_us: dict[KeyHash, list[float]] = {h: [] for h in KeyHash}
    for region in topology.regions:
        for key_hash in KeyHash:
            planner = QueryPlanner(replace(plan, key_hash=key_hash), region.name, NS)
            for _ in range(3):
                t0 = time.perf_counter()
                planner.query(prompt)
                query_us[key_hash].append((time.perf_counter() - t0) * 1e6)
        query = QueryPlanner(plan, region.name, NS).query(prompt)
        query_keys.append(len({key for pairs in query.per_region.values() for _, key in pairs}))
        probes.append(
            sum(len(pairs) * len(layout.tables_of(r)) for r, pairs in query.per_region.items())
        )
        local_credit.append(max((c for c, _ in query.per_region[region.name]), default=0))
        farthest = max(
            (r.name for r in topology.regions if r.name != region.name),
            key=lambda r: topology.rtt_ms(region.name, r),
        )
        far_credit.append(max((c for c, _ in query.per_region[farthest]), default=0))
    return {
        "entries_per_admit": round(float(np.mean(entries)), 1),
        "events_per_admit": round(float(np.mean(events)), 2),
        "admit_publish_us": round(float(np.median(admit_us)), 1),
        "query_keys_per_request": round(float(np.mean(query_keys)), 1),
        "probes_per_request": round(float(np.mean(probes)), 1),
        **{f"query_us_{h}": round(float(np.median(us)), 1) for h, us in query_us.items()},
        "credit_local_tokens": round(float(np.mean(local_credit))),
        "credit_farthest_tokens": round(float(np.mean(far_credit))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", default="testbed-3region,sim-8region")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    t_start = time.perf_counter()
    result: dict[str, Any] = {"shards": SHARDS, "prompt_tokens": list(PROMPT_TOKENS)}
    for name in args.topologies.split(","):
        base = load_builtin(name)
        rows: dict[str, Any] = {"context_tokens": base.model.context_tokens}
        for n_tokens in PROMPT_TOKENS:
            paper = _costs(_scheme(base, False), n_tokens, args.seed)
            long = _costs(_scheme(base, True), n_tokens, args.seed)
            rows[str(n_tokens)] = {
                "paper": paper,
                "long_context": long,
                "extra_entries_per_admit": round(
                    long["entries_per_admit"] - paper["entries_per_admit"], 1
                ),
                "extra_events_per_admit": round(
                    long["events_per_admit"] - paper["events_per_admit"], 2
                ),
            }
        result[name] = rows
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
