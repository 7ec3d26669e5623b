"""Benchmark of the worker's prefix cache in its steady state: µs per admitted block.

Usage: python bench/worker_cache.py [--quick] [--calls N] [--policy lru|lfu|fifo]
                                    [--against REV] [--rounds R] [--cache DIR]

One ``PrefixCache`` sized like a sim-8region worker (``PrefixCache.for_worker``: 16,384
VRAM and 65,536 DRAM blocks of 16 tokens) serves the Mixed workload's prompts (shared
system and tool prefixes, new suffixes, ~2,300 tokens each) through ``use()``. It is
first filled until both tiers are full, so that every timed admitted block forces a
demotion VRAM → DRAM and an eviction from DRAM: the state a long simulation spends
most of its time in, and one a short run never reaches.

``--against REV`` (default ``HEAD``; ``worktree``: the working tree itself) takes that
git revision's package, compiled, as ``bench/sim_ab.py`` does (kept by commit in
``--cache``), and runs it beside the working tree's in processes of their own, on the
same prompts, alternating ``--rounds`` times (the fastest round of each counts, so a
busy machine hurts both alike); ``ratio`` is old ÷ new time. Both must return the same
matches and report the same changes (``identical``). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.loadgen.workloads import make_workload
from kvcompass.topology import load_builtin
from kvcompass.worker import EvictionPolicy, PrefixCache, PrefixChange

TOPOLOGY = load_builtin("sim-8region")
ROOT = Path(__file__).resolve().parent.parent


def prompts(count: int, seed: int) -> list[tuple[Namespace, NDArray[np.uint32]]]:
    """Mixed prompts as the simulator hands them to its workers (uint32 arrays)."""
    model = TOPOLOGY.model.name
    requests = itertools.islice(make_workload("mixed", TOPOLOGY, 237.0, seed), count)
    return [(Namespace(model, r.tenant), np.array(r.tokens, dtype=np.uint32)) for r in requests]


def run(policy: EvictionPolicy, calls: int, seed: int) -> dict[str, Any]:
    """Fill a worker-sized cache with Mixed prompts, then time ``calls`` more ``use()``s."""
    stream = prompts(calls + 2000, seed)  # ~700 prompts fill the cache
    changes: list[tuple[Any, ...]] = []

    def on_change(c: PrefixChange) -> None:
        # What identifies a change, not its tokens: a worker hands them on and drops
        # them, and keeping thousands of prompt prefixes alive would time the memory.
        changes.append((c.namespace, c.kind, c.tier, c.lengths, c.tokens.size, int(c.tokens[-1])))

    cache = PrefixCache.for_worker(TOPOLOGY, TOPOLOGY.workers[0], policy, on_change)
    capacity = dict(cache.capacity)
    it = iter(stream)
    filled = 0
    for namespace, tokens in it:
        cache.use(namespace, tokens)
        filled += 1
        if all(cache.blocks(tier) == capacity[tier] for tier in capacity):
            break
    else:
        raise SystemExit("the stream ran out before the cache filled: raise --calls")
    timed = list(itertools.islice(it, calls))
    if len(timed) < calls:
        raise SystemExit("the stream ran out: raise the prompt count")
    changes.clear()
    block = cache.block_size
    gc.collect()
    t0 = time.perf_counter()
    matches = [cache.use(namespace, tokens) for namespace, tokens in timed]
    wall = time.perf_counter() - t0
    admitted = sum(
        min(len(tokens) // block, capacity[Tier.VRAM]) - m.tokens // block
        for (_, tokens), m in zip(timed, matches, strict=True)
    )
    digest = hashlib.sha256()
    for m in matches:
        digest.update(f"{m.tokens},{m.dram_tokens};".encode())
    for c in changes:
        digest.update(repr(c).encode())
    return {
        "fill_calls": filled,
        "calls": calls,
        "admitted_blocks": admitted,
        "changes": len(changes),
        "wall_s": wall,
        "us_per_call": wall / calls * 1e6,
        "us_per_admitted_block": wall / admitted * 1e6,
        "digest": digest.hexdigest()[:16],
    }


def main() -> None:
    from sim_ab import CACHE, child_run, export, package_root  # beside this file

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer timed calls")
    p.add_argument("--calls", type=int, help="timed use() calls once full")
    p.add_argument("--policy", choices=[e.value for e in EvictionPolicy], default="lru")
    p.add_argument("--against", default="HEAD", help="git revision of the old cache, or worktree")
    p.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache",
        type=Path,
        default=CACHE,
        help="where revisions are kept, by commit, compiled",
    )
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        policy, calls, seed = args.child
        print(json.dumps(run(EvictionPolicy(policy), int(calls), int(seed))))
        return
    calls = args.calls or (300 if args.quick else 1500)
    policy = EvictionPolicy(args.policy)
    rounds: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="kvc-cache-ab-") as tmp:
        old_source = ROOT if args.against == "worktree" else export(args.against, args.cache)
        roots = {
            "old": package_root(old_source, Path(tmp) / "old"),
            "new": package_root(ROOT, Path(tmp) / "new"),
        }
        for _ in range(args.rounds):
            for name, root in roots.items():
                run_args = [policy.value, str(calls), str(args.seed)]
                rounds[name].append(child_run(sys.executable, root, __file__, run_args))
    best = {name: min(runs, key=lambda r: r["wall_s"]) for name, runs in rounds.items()}
    report: dict[str, Any] = {
        "topology": TOPOLOGY.name,
        "policy": policy.value,
        "against": args.against,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for name, r in best.items():
        report[name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
    report["identical"] = len({r["digest"] for runs in rounds.values() for r in runs}) == 1
    report["ratio"] = round(best["old"]["wall_s"] / best["new"]["wall_s"], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
