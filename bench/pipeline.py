"""Benchmark of the event pipeline: publisher → kvc.events → MU → kvc.patches → edge view.

Usage: python bench/pipeline.py [--quick]

Prints one JSON object. Uses the embedded broker and redis-server (started and stopped
here) unless KVC_KAFKA_BOOTSTRAP / KVC_REDIS_URL point at running ones. Everything runs
on this machine, so the broker, Redis, the maintenance units, the edge replayer and this
load generator share its cores; the output says how many there are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from kvcompass import log as kvc_log
from kvcompass.index import LudoTable
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import Namespace, prefix_keys, shard_of, shard_of_array
from kvcompass.levels import plan_levels
from kvcompass.loadgen.testing import LocalCluster, poll_until
from kvcompass.pipeline.clock import SystemClock
from kvcompass.pipeline.writer import ShardWriter
from kvcompass.publisher import EventPublisher
from kvcompass.services.infra import Infra, InfraSettings
from kvcompass.services.snapstore import SnapshotStore
from kvcompass.shm import SharedIndexReader, SharedIndexWriter
from kvcompass.topology import load_builtin
from kvcompass.wire import EventKind

TOPOLOGY = "testbed-3region"
SHARDS = 4
NS = Namespace("bench-model")
#: Keys a worker's publisher buffers before sending (one batch per shard), like a
#: producer's linger: an engine flushes its events once per scheduling step.
BUFFERED_KEYS = 256
#: linger.ms of the workers' event producer in the latency run. The embedded broker
#: (Tansu, memory://) keeps every record batch for good and lists all of a partition's
#: batches on each fetch that finds new data (~1.2 µs per stored batch), so the ~130
#: batches/s per partition of a 2 ms linger at 5K key edits/s make every fetch of both
#: hops slower as the run goes on (measured, 30 s runs: p99 ~200 ms at 20 ms, ~80 ms
#: at 30 ms). The measurement includes this wait: a sample's clock starts before it is
#: produced.
EVENTS_LINGER_MS = 30.0


def _events(n_keys: int, seed: int) -> tuple[list[tuple[int, bytes]], int]:
    """Encoded event batches worth about ``n_keys`` key edits: mostly new prefixes
    (inserts), a quarter tier changes of earlier ones (value updates)."""
    topology = load_builtin(TOPOLOGY)
    plan = plan_levels(topology)
    rng = np.random.default_rng(seed)
    out: list[tuple[int, bytes]] = []
    pubs = [
        EventPublisher(
            w,
            plan,
            NS,
            SHARDS,
            lambda s, b: out.append((s, b)),
            max_buffered_keys=BUFFERED_KEYS,
        )
        for w in topology.workers
    ]
    keys = 0
    history: list[np.ndarray] = []
    while keys < n_keys:
        pub = pubs[int(rng.integers(len(pubs)))]
        if history and rng.random() < 0.25:
            batches = pub.publish(
                EventKind.TIER, history[int(rng.integers(len(history)))], Tier.DRAM
            )
        else:
            prompt = rng.integers(0, 100_000, int(rng.integers(1000, 9000)), dtype=np.uint32)
            history.append(prompt)
            batches = pub.publish(EventKind.ADMIT, prompt, Tier.VRAM)
        keys += sum(b.n_keys for b in batches)
    for pub in pubs:
        keys += sum(b.n_keys for b in pub.flush())
    return out, keys


def _throughput(
    bootstrap: str, redis_url: str, log_dir: Path, n_mu: int, n_keys: int
) -> dict[str, Any]:
    events, keys = _events(n_keys, seed=n_mu)
    cluster = LocalCluster(
        bootstrap, redis_url, log_dir, shards=SHARDS, topology=TOPOLOGY, initial_capacity=1 << 16
    )
    try:
        names = [f"mu{i}" for i in range(n_mu)]
        mus = [cluster.start_mu(n) for n in names]
        cluster.wait_assigned(*names)
        edge = cluster.start_edge()
        poll_until(cluster.edge_position, 60, "edge bootstrapped")
        t0 = time.perf_counter()
        for shard, data in events:
            cluster.send(shard, data)
            cluster.producer.poll(0)
        cluster.producer.flush(60)
        t_sent = time.perf_counter()
        last = cluster.wait_mu_caught_up(timeout=600)
        t_mu = time.perf_counter()
        cluster.wait_edge_at(last, timeout=600)
        t_edge = time.perf_counter()
        for proc in [*mus, edge]:
            cluster.stop(proc)
    finally:
        cluster.close()
    return {
        "key_edits": keys,
        "event_batches": len(events),
        "publish_s": round(t_sent - t0, 2),
        "mu_caught_up_s": round(t_mu - t0, 2),
        "edge_visible_s": round(t_edge - t0, 2),
        "key_edits_per_s": round(keys / (t_edge - t0)),
    }


def _latency_schedule(
    rate: float, seconds: float, tick_s: float
) -> list[tuple[float, list[tuple[int, bytes]], list[tuple[int, int, int, int]]]]:
    """Precomputed load: per tick (an engine step), the encoded batches to send and the
    samples (shard, table, key, expected value) whose visibility to time.

    Computing prompts and keys before the clock starts keeps the load generator, which
    shares the machine's two cores with everything it measures, as light as possible.
    """
    topology = load_builtin(TOPOLOGY)
    plan = plan_levels(topology)
    layout = IndexLayout.from_topology(topology)
    rng = np.random.default_rng(99)
    out: list[tuple[int, bytes]] = []
    pubs = [
        EventPublisher(
            w, plan, NS, SHARDS, lambda s, b: out.append((s, b)), max_buffered_keys=1 << 30
        )
        for w in topology.workers
    ]
    schedule = []
    keys_due = 0.0
    for tick in range(int(seconds / tick_s)):
        keys_due += rate * tick_s
        samples = []
        while keys_due > 0:
            pub = pubs[int(rng.integers(len(pubs)))]
            prompt = rng.integers(0, 100_000, int(rng.integers(1000, 6000)), dtype=np.uint32)
            keys = prefix_keys(prompt, plan.registration_lengths[pub.worker.region], NS)
            pub.publish(EventKind.ADMIT, prompt, Tier.VRAM)
            table, field = layout.slots[pub.worker.index]
            key = keys[max(keys)]
            samples.append((shard_of(key, SHARDS), table, key, int(Tier.VRAM) << (2 * field)))
            keys_due -= len(keys)
        for pub in pubs:
            pub.flush()
        schedule.append((tick * tick_s, list(out), samples))
        out.clear()
    return schedule


def _latency(
    bootstrap: str, redis_url: str, log_dir: Path, rate: float, seconds: float
) -> dict[str, Any]:
    """Event-to-visible latency of fresh prefixes at a fixed offered key-edit rate."""
    schedule = _latency_schedule(rate, seconds, tick_s=0.002)
    cluster = LocalCluster(
        bootstrap,
        redis_url,
        log_dir,
        shards=SHARDS,
        topology=TOPOLOGY,
        linger_ms=EVENTS_LINGER_MS,
    )
    try:
        mu = cluster.start_mu("mu-lat")
        cluster.wait_assigned("mu-lat")
        edge = cluster.start_edge("edge-lat")
        poll_until(cluster.edge_position, 60, "edge bootstrapped")
        reader = SharedIndexReader(cluster.shm_prefix)
        # Per shard, samples in send order: a shard's batches reach its view in that
        # order, so only the oldest unseen sample of each shard needs checking.
        pending: dict[int, deque[tuple[float, int, int, int]]] = {s: deque() for s in range(SHARDS)}
        latencies: list[float] = []
        keys_sent = 0
        start = time.perf_counter()
        next_tick = 0
        while next_tick < len(schedule) or any(pending.values()):
            now = time.perf_counter()
            while next_tick < len(schedule) and schedule[next_tick][0] <= now - start:
                _, batches, samples = schedule[next_tick]
                for shard, data in batches:
                    cluster.send(shard, data)
                sent = time.perf_counter()
                for shard, table, key, want in samples:
                    pending[shard].append((sent, table, key, want))
                keys_sent += sum(1 for _ in samples)
                next_tick += 1
            cluster.producer.poll(0)
            for shard, queue in pending.items():
                while queue:
                    sent, table, key, want = queue[0]
                    if reader.lookup(shard, table, key) != want:
                        if time.perf_counter() - sent > 60:
                            raise AssertionError(f"key {key} not visible after 60 s")
                        break
                    latencies.append(time.perf_counter() - sent)
                    queue.popleft()
            # Pace the generator: a busy loop would take a core from what it measures
            # (1 ms: half the CPU of 0.5 ms, and latencies are read to within 1 ms).
            time.sleep(0.001)
        elapsed = time.perf_counter() - start
        reader.close()
        cluster.stop(mu)
        cluster.stop(edge)
    finally:
        cluster.close()
    ms = np.array(latencies) * 1000
    return {
        "offered_key_edits_per_s": rate,
        "key_edits": int(rate * seconds),
        "samples": len(latencies),
        "elapsed_s": round(elapsed, 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def _bootstrap(redis_url: str, entries: int) -> dict[str, Any]:
    """Snapshot an index of ``entries`` keys to Redis, then bootstrap an edge from it."""
    topology = load_builtin(TOPOLOGY)
    layout = IndexLayout.from_topology(topology)
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 1 << 63, int(entries * 1.001), dtype=np.uint64))[:entries]
    shards = shard_of_array(keys, SHARDS)
    table_of = rng.integers(0, len(layout.tables), len(keys))
    values = rng.integers(1, 1 << 16, len(keys), dtype=np.uint64)
    import redis as redis_lib

    prefix = f"bench:{os.getpid()}:snap"
    store = SnapshotStore(redis_lib.Redis.from_url(redis_url), prefix)
    t0 = time.perf_counter()
    states = []
    for shard in range(SHARDS):
        tables = {}
        for spec in layout.tables:
            sel = (shards == shard) & (table_of == spec.table_id)
            tables[spec.table_id] = LudoTable.build(
                keys[sel],
                values[sel],
                capacity=int(sel.sum() / 0.85),  # room to grow, as a live table has
                value_bits=spec.value_bits,
                rng=random.Random(shard),
            )
        writer = ShardWriter(shard, SHARDS, topology, owner=f"bench/{prefix}", clock=SystemClock())
        writer.take_over(None, stream_epoch=None, stream_end=0, committed=False, events_low=0)
        writer.tables = ShardTables(writer.layout, shard, SHARDS, tables=tables)  # built in bulk
        states.append(writer)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for state in states:
        store.save(state.snapshot())
    snapshot_s = time.perf_counter() - t0
    view_bytes = sum(len(v) for s in states for v in s.snapshot().views.values())
    del states
    writer = SharedIndexWriter(f"kvcb{os.getpid()}", SHARDS, len(layout.tables))
    try:
        t0 = time.perf_counter()
        for shard in range(SHARDS):
            snap = store.load(shard, with_keys=False)
            assert snap is not None
            for table, image in snap.views.items():
                writer.load_table(shard, table, image)
        bootstrap_s = time.perf_counter() - t0
    finally:
        writer.close()
    client = redis_lib.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    return {
        "entries": entries,
        "build_s": round(build_s, 2),
        "snapshot_s": round(snapshot_s, 2),
        "bootstrap_s": round(bootstrap_s, 2),
        "view_mib": round(view_bytes / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, under 90 s")
    args = parser.parse_args()
    kvc_log.configure("warning", json=False, stream=sys.stderr)  # stdout is the JSON only
    quick = args.quick
    started = time.perf_counter()
    result: dict[str, Any] = {"quick": quick, "cpus": os.cpu_count(), "shards": SHARDS}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvc-bench-")))
        bootstrap = os.environ.get("KVC_KAFKA_BOOTSTRAP")
        redis_url = os.environ.get("KVC_REDIS_URL")
        if not bootstrap or not redis_url:
            infra = stack.enter_context(Infra.start(InfraSettings.from_env(run_dir=tmp / "infra")))
            bootstrap, redis_url = infra.kafka_bootstrap, infra.redis_url
        n_keys = 30_000 if quick else 200_000
        one = _throughput(bootstrap, redis_url, tmp, 1, n_keys)
        two = _throughput(bootstrap, redis_url, tmp, 2, n_keys)
        result["events_per_s_1mu"] = one["key_edits_per_s"]
        result["events_per_s_2mu"] = two["key_edits_per_s"]
        result["throughput_1mu"] = one
        result["throughput_2mu"] = two
        latency = _latency(bootstrap, redis_url, tmp, 5000.0, 8.0 if quick else 30.0)
        result["visible_latency_p50_ms"] = latency["p50_ms"]
        result["visible_latency_p99_ms"] = latency["p99_ms"]
        result["latency"] = latency
        entries = 1_000_000 if quick else 10_000_000
        boot = _bootstrap(redis_url, entries)
        result["snapshot_bootstrap"] = boot
        suffix = "1m" if quick else "10m"
        result[f"bootstrap_s_{suffix}"] = boot["bootstrap_s"]
        result[f"snapshot_s_{suffix}"] = boot["snapshot_s"]
        if quick:
            result["bootstrap_s_10m"] = None  # measured only without --quick
            result["snapshot_s_10m"] = None
    result["targets_met"] = {
        "events_1mu>=50K/s": result["events_per_s_1mu"] >= 50_000,
        "visible_p99<=50ms@5K/s": result["visible_latency_p99_ms"] <= 50,
        "bootstrap_10m<=3s": None
        if result["bootstrap_s_10m"] is None
        else result["bootstrap_s_10m"] <= 3,
    }
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
