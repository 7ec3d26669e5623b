"""Benchmark of the event-driven simulator: simulated requests per wall-clock second.

Usage: python bench/sim.py [--quick] [--requests N] [--rate R] [--seed S] [--repeat K]
                           [--long N] [--profile]

sim-8region (64 workers, 8 regions), KVCompass routing reading real edge views that real
maintenance writers keep up to date from the workers' real event batches. Two
workloads, generated before the clock starts (generation is timed apart):

- ``mixed``: the paper's Mixed workload look-alike (``kvcompass.loadgen.workloads``:
  ToolBench-like agent traces, LooGLE-like long documents, APPS-like problems).
- ``short``: the synthetic mix with prompts of a few hundred tokens, where the
  per-block cost of the worker cache matters least and the simulator's own overhead
  shows.

Beside each, the same run with round-robin routing (no index read) in the same process:
the difference is what routing costs. Then the simulator without the index: round-robin
with every worker's event batches dropped where they would be sent (no index write), so
only the engines with their caches, the event loop and the queue vectors run; what that
alone costs per request, against the budget, is what limits the rate. Per-request
component times come from a second KVCompass run that wraps the policies', engines',
publishers', writers' and edges' entry points (a few hundred ns each; its ``total``
includes them), in a process of its own where the modules mypyc compiles run from their
source (bench/sim_breakdown.py: a compiled object's methods cannot be replaced), so its
``total`` is above the headline's; the headline rate is from the unwrapped runs. Each
unwrapped run is made ``--repeat`` times on a fresh simulation (the machine is shared:
one run can lose a tenth to a neighbour): its ``sim_requests_per_s`` is the median
run's, ``runs_requests_per_s`` lists them all. Prints one JSON object; ``--profile``
also prints cProfile's top functions to stderr.

These runs are too short for any worker's cache to fill. ``--long N`` adds ``mixed_long``:
N Mixed requests at 1.5 λ0 with KVCompass and the paper's edges (no resync), as a
report's cells run; from about 15,000 requests on, workers' caches are full and every
admitted block demotes (later also evicts) one, which is what long studies pay.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import itertools
import json
import platform
import pstats
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvcompass.loadgen.reports.cells import no_reuse_capacity
from kvcompass.loadgen.sim import SimConfig, Simulation
from kvcompass.loadgen.workloads import LiveRequest, make_workload
from kvcompass.topology import load_builtin
from kvcompass.worker import EmulatedEngine

TOPOLOGY = load_builtin("sim-8region")
SHORT = {
    "system_tokens_min": "128",
    "system_tokens_max": "512",
    "tenants": "8",
    "user_tokens_min": "16",
    "user_tokens_max": "128",
    "document_share": "0",
    "answer_tokens_min": "8",
    "answer_tokens_max": "64",
}


def workload(kind: str, rate: float, count: int, seed: int) -> list[LiveRequest]:
    params: dict[str, Any] = SHORT if kind == "short" else {}
    name = "synthetic" if kind == "short" else kind
    return list(itertools.islice(make_workload(name, TOPOLOGY, rate, seed, **params), count))


class Timers:
    """Wall time and calls per wrapped entry point."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        return timed


class _TimedEngine:
    """An engine whose submit and advance are timed; everything else is the engine's.
    (The compiled engine's methods cannot be replaced on the object itself.)"""

    def __init__(self, engine: EmulatedEngine, timers: Timers) -> None:
        self._engine = engine
        self.submit = timers.wrap("engine_submit", engine.submit)
        self.advance = timers.wrap("engine_advance", engine.advance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def instrument(sim: Simulation) -> Timers:
    """Time the policies', engines', publishers', writers' and edges' entry points (the
    modules mypyc compiles imported from source: bench/sim_breakdown.py)."""
    timers = Timers()
    for policy in sim.policies.values():
        policy.decide = timers.wrap("decide", policy.decide)  # type: ignore[method-assign]
    for worker in sim.pool.workers:
        worker.engine = _TimedEngine(worker.engine, timers)  # type: ignore[assignment]
        publisher = worker.publisher
        publisher.flush = timers.wrap("publisher_flush", publisher.flush)  # type: ignore[method-assign]
    for writer in sim.index.writers:
        writer.stage = timers.wrap("writer_stage", writer.stage)  # type: ignore[method-assign]
        writer.flush = timers.wrap("writer_flush", writer.flush)  # type: ignore[method-assign]
    for edge in sim.index.replicas:
        edge.receive = timers.wrap("edge_receive", edge.receive)  # type: ignore[method-assign]
    return timers


def drop_index_writes(sim: Simulation) -> None:
    """Every worker's buffered event batches are discarded where they would be sent."""
    for worker in sim.pool.workers:
        worker.sends = False


def breakdown(kind: str, rate: float, count: int, seed: int, resync: bool) -> dict[str, Any]:
    """A timed KVCompass run, from bench/sim_breakdown.py: :func:`run`'s keys, with
    ``us_per_request`` and ``us_per_call``."""
    script = Path(__file__).with_name("sim_breakdown.py")
    args = [kind, str(rate), str(count), str(seed), str(resync)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{script.name} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def run(
    policy: str,
    requests: list[LiveRequest],
    seed: int,
    timed: bool,
    floor: bool = False,
    resync: bool = True,
    repeat: int = 1,
) -> dict[str, Any]:
    """``repeat`` runs, each on a fresh simulation; the median run's wall time."""
    walls = []
    for _ in range(repeat):
        sim = Simulation(SimConfig(TOPOLOGY, policy=policy, seed=seed, resync=resync))
        timers = instrument(sim) if timed else None
        if floor:
            drop_index_writes(sim)
        gc.collect()
        t0 = time.perf_counter()
        result = sim.run(requests)
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    n = len(result.records)
    out: dict[str, Any] = {
        "requests": n,
        "wall_s": round(wall, 3),
        "sim_requests_per_s": round(n / wall, 1),
        "runs_requests_per_s": [round(n / w, 1) for w in walls],
        "simulated_s": round(result.stats["simulated_s"], 2),
        "mean_prompt_tokens": round(sum(r.prompt_tokens for r in result.records) / n),
        "index_keys_applied": result.stats["index_keys_applied"],
        "patch_batches": result.stats["patch_batches"],
    }
    if timers is not None:
        out["us_per_request"] = {
            name: round(secs / n * 1e6, 1) for name, secs in sorted(timers.seconds.items())
        }
        out["us_per_call"] = {
            name: round(secs / timers.calls[name] * 1e6, 1)
            for name, secs in sorted(timers.seconds.items())
        }
        out["us_per_request"]["total"] = round(wall / n * 1e6, 1)
    return out


def kvcompass_run(
    kind: str,
    rate: float,
    requests: list[LiveRequest],
    seed: int,
    resync: bool = True,
    repeat: int = 1,
) -> dict[str, Any]:
    """KVCompass's headline from runs without the timers (a few hundred ns per wrapped
    call) over ``requests`` (``workload(kind, rate, ...)``), its per-component times from
    one more, timed run (:func:`breakdown`)."""
    out = run("kvcompass", requests, seed, timed=False, resync=resync, repeat=repeat)
    timed = breakdown(kind, rate, len(requests), seed, resync)
    return {**out, "us_per_request": timed["us_per_request"], "us_per_call": timed["us_per_call"]}


def long_run(count: int, seed: int) -> dict[str, Any]:
    """``count`` Mixed requests at 1.5 λ0, KVCompass, no resync."""
    rate = 1.5 * no_reuse_capacity(TOPOLOGY.name)
    requests = workload("mixed", rate, count, seed)
    kvc = kvcompass_run("mixed", rate, requests, seed, resync=False)
    return {"rate": round(rate, 1), "kvcompass": kvc}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests (well under a minute)")
    p.add_argument("--requests", type=int, help="requests per run")
    p.add_argument("--rate", type=float, default=500.0, help="arrivals per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="K",
        help="runs of each unwrapped simulation; the median is reported (default 3)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the short kvcompass run (time in compiled code counts to its callers)",
    )
    p.add_argument(
        "--long",
        type=int,
        default=0,
        metavar="N",
        help="also N Mixed requests at 1.5 λ0, long enough to fill caches (20000: ~25 s)",
    )
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    count = args.requests or (1000 if args.quick else 5000)
    report: dict[str, Any] = {
        "topology": TOPOLOGY.name,
        "workers": len(TOPOLOGY.workers),
        # The interpreter's build moves every number here (see scripts/_env.sh).
        "python": {"version": platform.python_version(), "executable": sys.executable},
    }
    # Loading the index's compiled write kernel (numba's cache) takes seconds once per
    # process: pay it before any clock starts.
    Simulation(SimConfig(TOPOLOGY, seed=args.seed)).run(workload("short", 50.0, 50, args.seed))
    for kind in ("short", "mixed"):
        t0 = time.perf_counter()
        requests = workload(kind, args.rate, count, args.seed)
        generated = time.perf_counter() - t0
        kvc = kvcompass_run(kind, args.rate, requests, args.seed, repeat=args.repeat)
        baseline = run("round-robin", requests, args.seed, timed=False, repeat=args.repeat)
        floor = run("round-robin", requests, args.seed, timed=False, floor=True, repeat=args.repeat)
        report[kind] = {
            "workload_requests_per_s": round(count / generated, 1),
            "kvcompass": kvc,
            "round_robin": baseline,
            "floor_without_index_writes": floor,
        }
        if args.profile and kind == "short":
            profiler = cProfile.Profile()
            profiler.runcall(Simulation(SimConfig(TOPOLOGY, seed=args.seed)).run, requests)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            print(text.getvalue(), file=sys.stderr)
    if args.long:
        report["mixed_long"] = long_run(args.long, args.seed)
    report["sim_requests_per_s"] = report["short"]["kvcompass"]["sim_requests_per_s"]
    report["target_sim_requests_per_s"] = 20_000
    # The target as a per-request budget, and how many times over it each workload is.
    report["target_us_per_request"] = 1e6 / 20_000
    report["times_over_target"] = {
        kind: round(20_000 / report[kind]["kvcompass"]["sim_requests_per_s"], 1)
        for kind in ("short", "mixed")
    }
    # What limits it: the engines, caches, loop and queue vectors alone, against the budget.
    report["floor_times_over_target"] = {
        kind: round(20_000 / report[kind]["floor_without_index_writes"]["sim_requests_per_s"], 1)
        for kind in ("short", "mixed")
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
