"""Workloads for the simulator's tests: small, fast and with known statistics."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import numpy as np

from kvcompass.loadgen.workloads import (
    LiveRequest,
    RegionShares,
    SyntheticConfig,
    SyntheticWorkload,
    poisson_times,
)
from kvcompass.topology import Region, Topology

__all__ = ["roomy", "shared_prefixes", "unique_prompts"]


def unique_prompts(
    topology: Topology, rate: float, count: int, lengths: tuple[int, int], seed: int = 0
) -> Iterator[LiveRequest]:
    """Poisson arrivals of prompts no two of which share a block (random 32-bit ids), of
    uniform length in ``lengths`` (inclusive), one output token, origins round-robin.
    Nothing is ever reused, so a worker's service time is exactly β·length."""
    rng = np.random.default_rng([seed, 0x51])
    regions = [r.name for r in topology.regions]
    times = poisson_times(rate, seed)
    for i, at in zip(range(count), times, strict=False):
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        tokens = rng.integers(0, 2**32, n, dtype=np.uint32).tolist()
        yield LiveRequest(at, regions[i % len(regions)], "t", tokens, 1, f"s{i}", f"r{i}")


def shared_prefixes(
    topology: Topology, rate: float, count: int, seed: int = 0
) -> list[LiveRequest]:
    """The synthetic mixed workload, shrunk: short system prompts and documents shared by
    sessions of every region, multi-turn sessions, two tenants."""
    config = SyntheticConfig(
        seed=seed,
        rate=rate,
        system_tokens_min=64,
        system_tokens_max=256,
        document_tokens_min=512,
        document_tokens_max=1024,
        user_tokens_min=16,
        user_tokens_max=64,
        answer_tokens_min=2,
        answer_tokens_max=8,
        document_share=0.5,
        max_prompt_tokens=4096,
    )
    requests = SyntheticWorkload(config, RegionShares.of(topology)).requests()
    return list(itertools.islice(requests, count))


def roomy(topology: Topology, gib: int = 64) -> Topology:
    """``topology`` with ``gib`` GiB of VRAM and of DRAM per worker: nothing is evicted in
    a short test (eviction is the cache's business; these tests are about queues)."""
    size = gib << 30
    regions = tuple(
        Region(
            r.name,
            tuple(dataclasses.replace(w, vram_bytes=size, dram_bytes=size) for w in r.workers),
        )
        for r in topology.regions
    )
    return dataclasses.replace(topology, regions=regions)
