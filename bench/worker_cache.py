"""Benchmark of the worker's prefix cache in its steady state: µs per admitted block.

Usage: python bench/worker_cache.py [--quick] [--calls N] [--policy lru|lfu|fifo]
                                    [--against REV] [--rounds R]

One ``PrefixCache`` sized like a sim-8region worker (``PrefixCache.for_worker``: 16,384
VRAM and 65,536 DRAM blocks of 16 tokens) serves the Mixed workload's prompts (shared
system and tool prefixes, new suffixes, ~2,300 tokens each) through ``use()``. It is
first filled until both tiers are full, so that every timed admitted block forces a
demotion VRAM → DRAM and an eviction from DRAM: the state a long simulation spends
most of its time in, and one a short run never reaches.

``--against REV`` (default ``HEAD``) loads ``shared/kvcompass/worker/cache.py`` of that
git revision into a module of its own and runs it beside the working tree's, on the same
prompts, alternating ``--rounds`` times (the fastest round of each counts, so a busy
machine hurts both alike); ``ratio`` is old ÷ new time. Both must return the same
matches and report the same changes (``identical``). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.loadgen.workloads import make_workload
from kvcompass.topology import load_builtin
from kvcompass.worker import EvictionPolicy, PrefixCache, PrefixChange

TOPOLOGY = load_builtin("sim-8region")
CACHE_SOURCE = "shared/kvcompass/worker/cache.py"


class Cache(Protocol):
    """What the benchmark calls: the old and the new ``PrefixCache`` alike."""

    block_size: int
    capacity: dict[Tier, int]

    def use(self, namespace: Namespace, tokens: NDArray[np.uint32]) -> Any: ...

    def blocks(self, tier: Tier) -> int: ...


def revision_cache(rev: str) -> Any:
    """``PrefixCache`` as of git revision ``rev``, imported as a module of its own."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{rev}:{CACHE_SOURCE}"], cwd=root, check=True, capture_output=True
    ).stdout
    name = f"_kvcompass_cache_{rev.replace('~', '_').replace('^', '_')}"
    fd, path = tempfile.mkstemp(suffix=".py")
    with os.fdopen(fd, "wb") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    os.unlink(path)
    return module.PrefixCache


def prompts(count: int, seed: int) -> list[tuple[Namespace, NDArray[np.uint32]]]:
    """Mixed prompts as the simulator hands them to its workers (uint32 arrays)."""
    model = TOPOLOGY.model.name
    requests = itertools.islice(make_workload("mixed", TOPOLOGY, 237.0, seed), count)
    return [(Namespace(model, r.tenant), np.array(r.tokens, dtype=np.uint32)) for r in requests]


def run(
    cache_class: Any,
    policy: EvictionPolicy,
    stream: list[tuple[Namespace, NDArray[np.uint32]]],
    calls: int,
) -> dict[str, Any]:
    """Fill a worker-sized cache from ``stream``, then time ``calls`` more ``use()``s."""
    changes: list[PrefixChange] = []
    cache: Cache = cache_class.for_worker(TOPOLOGY, TOPOLOGY.workers[0], policy, changes.append)
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
        digest.update(f"{c.namespace}|{c.kind}|{c.tier}|{c.lengths}|".encode())
        digest.update(c.tokens.tobytes())
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer timed calls")
    p.add_argument("--calls", type=int, help="timed use() calls once full")
    p.add_argument("--policy", choices=[e.value for e in EvictionPolicy], default="lru")
    p.add_argument("--against", default="HEAD", help="git revision of the old cache")
    p.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    calls = args.calls or (300 if args.quick else 1500)
    policy = EvictionPolicy(args.policy)
    stream = prompts(calls + 2000, args.seed)  # ~700 prompts fill the cache
    contenders = {"old": revision_cache(args.against), "new": PrefixCache}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, cache_class in contenders.items():
            rounds[name].append(run(cache_class, policy, stream, calls))
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
