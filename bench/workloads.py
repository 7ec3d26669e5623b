"""How fast the workload generators make requests (the simulator targets 20,000 req/s).

Usage: python bench/workloads.py [--requests N] [--rounds R] [--topology NAME] [--rate R]

Prints one JSON object. Each round times every workload side by side (interleaved, so
the shared machine's noise hits all alike) generating N requests through
``make_workload`` and consuming them as a simulator would (one at a time, none kept).
Per workload, the best round's ``req_per_s`` and ``mtok_per_s`` (prompt tokens made per
second, millions) by wall clock, ``cpu_req_per_s`` by the process's CPU time (what a
core gives when other processes share it), and ``setup_s`` (building the generator and
its first request; the token pool is made once per process before timing).

Prompts are ``array('I')`` slices of one token pool (``workloads/draws.py``). Two
baselines at the same Mixed prompt lengths: ``pool_slices``, the slices alone (what any
generator pays for its tokens), and ``as_lists``, each slice made a ``list[int]`` (what
the generators paid while prompts were lists, and what the live driver pays per request
for its JSON body). With ``load_average_*`` near or above the core count, wall times
include waits for a core; ``python_loop_ns`` (one iteration of a plain Python loop,
~15-25 ns on an idle modern core) shows how slow the shared core was.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import time
from typing import Any

import numpy as np

from kvcompass.loadgen.workloads import make_workload
from kvcompass.loadgen.workloads.draws import token_pool
from kvcompass.topology import load_builtin

NAMES = ("mixed", "wildchat", "lmsys", "synthetic")


def _time(name: str, topology: Any, rate: float, n: int) -> dict[str, float]:
    t0 = time.perf_counter()
    requests = make_workload(name, topology, rate, seed=1)
    next(requests)  # the first request builds what the generator builds lazily
    t1, c1 = time.perf_counter(), time.process_time()
    tokens = 0
    for request in itertools.islice(requests, n):
        tokens += len(request.tokens)
    t2, c2 = time.perf_counter(), time.process_time()
    return {
        "req_per_s": n / (t2 - t1),
        "cpu_req_per_s": n / (c2 - c1),
        "mtok_per_s": tokens / (t2 - t1) / 1e6,
        "mean_prompt_tokens": tokens / n,
        "setup_s": t1 - t0,
    }


def _slices(lengths: list[int], as_lists: bool) -> dict[str, float]:
    pool = token_pool(128_000)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(pool) - max(lengths), len(lengths)).tolist()
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = 0
    for at, n in zip(starts, lengths, strict=True):
        prompt = pool[at : at + n]
        tokens += len(prompt.tolist() if as_lists else prompt)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "req_per_s": len(lengths) / elapsed,
        "cpu_req_per_s": len(lengths) / cpu,
        "mtok_per_s": tokens / elapsed / 1e6,
    }


def _loop_ns() -> float:
    t0 = time.process_time()
    x = 0
    for i in range(1_000_000):
        x += i
    return (time.process_time() - t0) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=50_000, help="requests per workload")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the best one counts")
    p.add_argument("--topology", default="sim-8region", help="built-in topology")
    p.add_argument("--rate", type=float, default=3000.0, help="Poisson req/s (paper: 3000)")
    args = p.parse_args()
    topology = load_builtin(args.topology)
    make_workload("mixed", topology, args.rate, 1)  # the token pool, once per process
    lengths = [
        len(r.tokens)
        for r in itertools.islice(make_workload("mixed", topology, args.rate, 1), args.requests)
    ]
    result: dict[str, Any] = {
        "topology": args.topology,
        "rate": args.rate,
        "requests": args.requests,
        "load_average_before": round(os.getloadavg()[0], 2),
        "python_loop_ns": round(_loop_ns(), 1),
    }
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        rounds = {name: _time(name, topology, args.rate, args.requests) for name in NAMES}
        rounds["pool_slices"] = _slices(lengths, as_lists=False)
        rounds["as_lists"] = _slices(lengths, as_lists=True)
        gc.collect()
        for name, numbers in rounds.items():
            if name not in best or numbers["req_per_s"] > best[name]["req_per_s"]:
                best[name] = numbers
    result["workloads"] = {
        name: {k: round(v, 3 if k == "setup_s" else 1) for k, v in numbers.items()}
        for name, numbers in best.items()
    }
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
