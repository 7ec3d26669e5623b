"""Benchmark of an edge router's decision path: prefix keys, the index match through the
shared-memory reader, and the score, for a 4096-token prompt.

Usage: python bench/routing.py [--quick] [--prompts N] [--seed S] [--profile]

Prints one JSON object. For each topology (testbed-3region, sim-8region, sim-16region)
and each key hash (sha256, xxh3), this process fills an index with the registrations of
workers that cached some of the prompts, publishes it through a SharedIndexWriter, and
a spawned router process attaches a SharedIndexReader and times, per prompt and side by
side (interleaved, so the shared machine's noise hits all alike):

- ``keys``: the edge's keys at every query length and, as the router ships the prefix
  chain, every guard length (``QueryPlanner.query``);
- ``shm_match``: keys + ``SharedIndexReader.match``, the router's lookup;
- ``view_match``: keys + the in-process ``DiscoveryView.match`` (the same compiled
  match without the shared-memory read section);
- ``decision``: the routing core's ``decide`` over that reader (``make_policy
  ("kvcompass", ...)``, default config, idle queues): keys, match, joint score over
  every worker, ranking, migration check.

``decision_p50_us`` / ``decision_p99_us`` at the top are testbed-3region with the
default key hash. On a shared machine (``load_average_*`` near or above the core count)
every time includes waits for a core and the P99s mostly measure other processes; the
P10s show what an unloaded core gives. ``key_hashes`` times the hashes alone on
one prompt's query lengths (SHA-256, XXH3-64 and, if the ``mmh3`` package is installed,
MurmurHash3 x64-128, all streaming). The router service's proxy overhead is the
router's own benchmark, not this one.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import importlib
import io
import json
import multiprocessing as mp
import os
import pstats
import random
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from numpy.typing import NDArray

from kvcompass.index.discovery import DiscoveryView, Match, MatchProbes, QueryPlanner
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import DEFAULT_KEY_HASH, KeyHash, Namespace, prefix_keys, shard_of_array
from kvcompass.levels import plan_levels
from kvcompass.pipeline.clock import SystemClock
from kvcompass.routing import Decision, RouteRequest, RoutingConfig, make_policy
from kvcompass.shm import SharedIndexReader, SharedIndexWriter
from kvcompass.topology import Topology, load_builtin

TOPOLOGIES = ("testbed-3region", "sim-8region", "sim-16region")
PROMPT_TOKENS = 4096
SHARDS = 4  # the services' default (KVC_SHARDS)
NS = Namespace("bench-model")
#: Prompts cached somewhere in the index besides the timed ones: a few thousand entries
#: per region table, so lookups touch real, not empty, tables.
BACKGROUND_PROMPTS = 2000
#: Paper's C++ number (keys + five-level lookup + score over 14 workers), §5.
PAPER_DECISION_US = 20.6
TARGET_P50_US = 50.0

Images = dict[tuple[int, int], bytes]


def _topology(name: str, key_hash: KeyHash) -> Topology:
    topology = load_builtin(name)
    return replace(topology, index=replace(topology.index, key_hash=key_hash))


def _prompts(seed: int, n: int) -> list[NDArray[np.uint32]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 128_000, PROMPT_TOKENS, dtype=np.uint32) for _ in range(n)]


def _populate(topology: Topology, prompts: list[NDArray[np.uint32]], seed: int) -> Images:
    """View images of an index where half the timed prompts have 1-3 holders (random
    workers, cached lengths and tiers) and background prompts fill the tables."""
    plan = plan_levels(topology)
    layout = IndexLayout.from_topology(topology)
    rng = random.Random(seed)
    shards = [ShardTables(layout, s, SHARDS, initial_capacity=4096, rng=rng) for s in range(SHARDS)]
    background = _prompts(seed + 1, BACKGROUND_PROMPTS)
    cached = [(p, rng.randint(1, 3)) for p in prompts[::2]] + [(p, 1) for p in background]
    for prompt, n_holders in cached:
        for w in rng.sample(topology.workers, n_holders):
            upto = rng.choice((512, 2048, 3000, PROMPT_TOKENS))
            lengths = [c for c in plan.registration_lengths[w.region] if c <= upto]
            keys = np.fromiter(prefix_keys(prompt, lengths, NS, plan.key_hash).values(), np.uint64)
            owners = shard_of_array(keys, SHARDS)
            tier = rng.choice((Tier.VRAM, Tier.DRAM))
            for tables in shards:
                tables.set_tier(keys[owners == tables.shard], w.index, tier)
    return {(s.shard, t): img for s in shards for t, img in s.view_images().items()}


# --- the decision ------------------------------------------------------------------------


def _policy_decide(
    topology: Topology, edge: str, reader: SharedIndexReader
) -> Callable[[NDArray[np.uint32]], Decision]:
    """The routing core's ``decide`` over ``reader``, idle queues, default config."""
    policy = make_policy("kvcompass", topology, edge, reader, clock=SystemClock())

    def decide(tokens: NDArray[np.uint32]) -> Decision:
        return policy.decide(RouteRequest("bench", tokens, edge, NS))

    return decide


# --- the router process ------------------------------------------------------------------


def _router(
    cases: list[tuple[str, str, str, Images]],
    seed: int,
    n_prompts: int,
    profile: bool,
    out: mp.Queue[Any],
) -> None:
    """Time every variant of every case, interleaved prompt by prompt within each
    topology: the load of the shared machine changes by the second, so only side-by-side
    ratios hold."""
    prompts = _prompts(seed, n_prompts)
    Variants = dict[str, Callable[[NDArray[np.uint32]], Any]]
    timed: dict[tuple[str, str], Variants] = {}
    facts: dict[tuple[str, str], dict[str, Any]] = {}
    with ExitStack() as stack:
        for topology_name, key_hash, prefix, images in cases:
            topology = _topology(topology_name, KeyHash(key_hash))
            layout = IndexLayout.from_topology(topology)
            edge = topology.regions[0].name
            chained = RoutingConfig.prefix_chain
            planner = QueryPlanner(plan_levels(topology), edge, NS, chained)
            view = DiscoveryView.from_images(layout, SHARDS, images)
            reader = stack.enter_context(SharedIndexReader(prefix, layout))
            for prompt in prompts[:8]:  # maps every segment, warms caches
                if reader.match(planner.query(prompt)) != view.match(planner.query(prompt)):
                    raise RuntimeError("the shared-memory reader answered unlike the view")
            timed[(topology_name, key_hash)] = {
                "keys": planner.query,
                "shm_match": _matching(planner, reader),
                "view_match": _matching(planner, view),
                "decision": _policy_decide(topology, edge, reader),
            }
            keys, rows = MatchProbes(layout).rows(planner.query(prompts[0]))
            facts[(topology_name, key_hash)] = {
                "workers": len(topology.workers),
                "tables": len(layout.tables),
                "query_keys": len(keys),
                "probes": int((rows[:, 0] < len(keys)).sum()),  # the kernel skips the rest
            }
        for variants in timed.values():
            for prompt in prompts[:8]:
                for fn in variants.values():
                    fn(prompt)
        samples: dict[tuple[str, str, str], list[int]] = {
            (*case, name): [] for case, variants in timed.items() for name in variants
        }
        # One topology at a time (a router holds one index in its caches), its key
        # hashes and variants interleaved.
        for topology_name in dict.fromkeys(name for name, _ in timed):
            together = {c: v for c, v in timed.items() if c[0] == topology_name}
            gc.collect()
            # Each prompt once: a prompt decided again within a second is a hot prefix
            # family to the policy, and its migration planning is not the common path.
            for prompt in prompts[8:]:
                for case, variants in together.items():
                    for name, fn in variants.items():
                        prompt.sum()  # in cache, as a prompt the router just parsed is
                        t0 = time.perf_counter_ns()
                        fn(prompt)
                        samples[(*case, name)].append(time.perf_counter_ns() - t0)
        results: dict[str, Any] = {}
        for case, variants in timed.items():
            row: dict[str, Any] = {}
            for name in variants:
                us = np.array(samples[(*case, name)]) / 1e3
                for q in (10, 50, 99):
                    row[f"{name}_p{q}_us"] = round(float(np.percentile(us, q)), 1)
            row["shm_vs_view_p50"] = round(row["shm_match_p50_us"] / row["view_match_p50_us"], 2)
            row["keys_share_of_decision"] = round(row["keys_p50_us"] / row["decision_p50_us"], 2)
            row.update(facts[case])
            if profile:
                row["profile"] = _profile(variants["decision"], prompts)
            results.setdefault(case[0], {})[case[1]] = row
    out.put(results)


def _matching(
    planner: QueryPlanner, reader: SharedIndexReader | DiscoveryView
) -> Callable[[NDArray[np.uint32]], Match]:
    return lambda tokens: reader.match(planner.query(tokens))


def _profile(fn: Callable[[NDArray[np.uint32]], Any], prompts: list[NDArray[np.uint32]]) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for prompt in prompts:
        fn(prompt)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue()


# --- the key hashes alone ------------------------------------------------------------------


def _key_hashes(seed: int, repeats: int) -> dict[str, Any]:
    """Keys of one 4096-token prompt at testbed us-edge query lengths, per hash."""
    topology = load_builtin("testbed-3region")
    lengths = [c for c in plan_levels(topology).all_query_lengths("us") if c <= PROMPT_TOKENS]
    prompt = _prompts(seed, 1)[0]
    data = memoryview(prompt.tobytes())

    def streaming(new: Callable[[bytes], Any], read: Callable[[Any], int]) -> Callable[[], Any]:
        def run() -> list[int]:
            h, done, out = new(NS.prefix), 0, []
            for c in lengths:
                h.update(data[done : 4 * c])
                out.append(read(h))
                done = 4 * c
            return out

        return run

    fns: dict[str, Callable[[], Any]] = {
        "sha256": streaming(hashlib.sha256, lambda h: int.from_bytes(h.digest()[:8], "little")),
        "xxh3_64": streaming(xxhash.xxh3_64, lambda h: int(h.intdigest())),
        "xxh3_64_copy": streaming(xxhash.xxh3_64, lambda h: int(h.copy().intdigest())),
    }
    try:
        mmh3: Any = importlib.import_module("mmh3")
        fns["mmh3_x64_128"] = streaming(mmh3.mmh3_x64_128, lambda h: int(h.uintdigest()))
    except ImportError:
        pass

    def query(key_hash: KeyHash) -> Callable[[], Any]:
        planner = QueryPlanner(plan_levels(_topology("testbed-3region", key_hash)), "us", NS)
        return lambda: planner.query(prompt)

    for key_hash in KeyHash:
        fns[f"planner_{key_hash}"] = query(key_hash)
    samples: dict[str, list[int]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            samples[name].append(time.perf_counter_ns() - t0)
    out: dict[str, Any] = {"lengths": lengths, "prompt_tokens": PROMPT_TOKENS}
    for name, ns in samples.items():
        out[f"{name}_p50_us"] = round(float(np.percentile(ns, 50)) / 1e3, 2)
    out["sha256_vs_xxh3"] = round(out["sha256_p50_us"] / out["xxh3_64_p50_us"], 1)
    out["mmh3_installed"] = "mmh3_x64_128_p50_us" in out
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts, under 60 s")
    parser.add_argument("--prompts", type=int, default=None, help="timed prompts per case")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="cProfile the decision path")
    parser.add_argument(
        "--proxy",
        action="store_true",
        help="also run bench/router_proxy.py (proxy overhead, router req/s) into this JSON",
    )
    args = parser.parse_args()
    n_prompts = args.prompts or (400 if args.quick else 2000)
    t_start = time.perf_counter()
    result: dict[str, Any] = {"quick": args.quick, "prompt_tokens": PROMPT_TOKENS}
    result["cpus"] = os.cpu_count()
    result["load_average_before"] = round(os.getloadavg()[0], 2)
    result["default_key_hash"] = str(DEFAULT_KEY_HASH)
    result["key_hashes"] = _key_hashes(args.seed, 300 if args.quick else 2000)

    prompts = _prompts(args.seed, n_prompts)
    writers: list[SharedIndexWriter] = []
    cases: list[tuple[str, str, str, Images]] = []
    try:
        for name in TOPOLOGIES:
            for key_hash in KeyHash:
                topology = _topology(name, key_hash)
                images = _populate(topology, prompts, args.seed)
                prefix = f"kvcbr{os.getpid()}{len(writers)}"
                n_tables = len(IndexLayout.from_topology(topology).tables)
                writer = SharedIndexWriter(prefix, SHARDS, n_tables)
                writers.append(writer)
                for (shard, table), image in images.items():
                    writer.load_table(shard, table, image)
                for shard in range(SHARDS):
                    writer.set_position(shard, seq=0, epoch=1)
                cases.append((name, str(key_hash), prefix, images))
        ctx = mp.get_context("spawn")
        out: mp.Queue[Any] = ctx.Queue()
        router = ctx.Process(target=_router, args=(cases, args.seed, n_prompts, args.profile, out))
        router.start()
        try:
            per_case = out.get(timeout=900)
        finally:
            router.join(timeout=60)
    finally:
        for writer in writers:
            writer.close()
    if router.exitcode != 0:
        raise RuntimeError(f"router process exited with {router.exitcode}")
    if args.profile:
        for name, rows in per_case.items():
            for key_hash, row in rows.items():
                print(f"== {name} {key_hash}\n{row.pop('profile')}", file=sys.stderr)
    result["topologies"] = per_case
    head = per_case["testbed-3region"][str(DEFAULT_KEY_HASH)]
    result["decision_p50_us"] = head["decision_p50_us"]
    result["decision_p99_us"] = head["decision_p99_us"]
    result["decision_p10_us"] = head["decision_p10_us"]
    for name in TOPOLOGIES[1:]:
        row = per_case[name][str(DEFAULT_KEY_HASH)]
        short = name.replace("-", "_")
        result[f"decision_p50_us_{short}"] = row["decision_p50_us"]
        result[f"decision_p99_us_{short}"] = row["decision_p99_us"]
    sha = per_case["testbed-3region"][str(KeyHash.SHA256)]
    result["decision_p50_us_sha256"] = sha["decision_p50_us"]
    result["decision_sha256_vs_default"] = round(
        sha["decision_p50_us"] / head["decision_p50_us"], 2
    )
    result["decision_vs_paper_cpp"] = round(head["decision_p50_us"] / PAPER_DECISION_US, 2)
    result["targets_met"] = {
        "decision_p50<=50us": head["decision_p50_us"] <= TARGET_P50_US,
        "decision_p50<=paper_20.6us": head["decision_p50_us"] <= PAPER_DECISION_US,
    }
    if args.proxy:
        # Its own processes (router, stub worker): a subprocess keeps them apart from ours.
        proxy = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("router_proxy.py"))]
            + (["--quick"] if args.quick else []),
            capture_output=True,
            text=True,
            check=True,
        )
        measured = json.loads(proxy.stdout)
        result["proxy"] = measured
        result["proxy_overhead_p50_ms"] = measured.get("proxy_overhead_p50_ms")
        result["router_requests_per_s"] = measured.get("router_requests_per_s")
        result["targets_met"]["proxy_overhead_p50<=2ms"] = (
            measured.get("proxy_overhead_p50_ms", float("inf")) <= 2.0
        )
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
