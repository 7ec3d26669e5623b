"""``kvcompass index-demo``: build a discovery index from synthetic prompts and time it.

Synthetic prompts come in families sharing a system prompt (as real traffic does); each
prompt is cached by one to three random workers of the topology, in VRAM or DRAM, and
registered at its region's registration lengths. The demo bulk-builds the maintenance
tables, derives the keyless edge views from their images, then reports view memory,
batch and per-request lookup speed, and the false-hit rate for never-inserted prefixes.
"""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.discovery import DiscoveryView, QueryPlanner, TableKey
from kvcompass.index.layout import IndexLayout, Tier, with_tier
from kvcompass.index.ludo import LudoTable
from kvcompass.keys import Namespace, TokenIds, prefix_keys
from kvcompass.levels import plan_levels
from kvcompass.topology import Topology, load_builtin

__all__ = ["DemoReport", "check_fits", "match_latencies_us", "run_index_demo"]

#: Peak memory of a run: about this much per entry (the build's key → value dicts, the
#: tables and their view images) over a fixed base. Measured with /usr/bin/time on
#: testbed-3region: 0.39 GB at 500,000 entries, 1.36 GB at 4,000,000.
BYTES_PER_ENTRY = 300
BASE_BYTES = 300 << 20


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can take without swapping (Linux
    MemAvailable), else free physical memory; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(entries: int, available: int | None) -> None:
    """ValueError, before anything is built, when ``entries`` would need more memory than
    ``available`` (bytes; None: unknown, not checked): an out-of-memory kill half-way
    through a build tells the user nothing."""
    need = BASE_BYTES + BYTES_PER_ENTRY * entries
    if available is not None and need > available:
        most = max(0, (available - BASE_BYTES) // BYTES_PER_ENTRY)
        raise ValueError(
            f"--entries {entries:,} needs about {need / 2**30:.1f} GiB "
            f"(~{BYTES_PER_ENTRY} bytes per entry); {available / 2**30:.1f} GiB is "
            f"available here, enough for about {most:,}"
        )


@dataclass(frozen=True)
class DemoReport:
    rows: list[tuple[str, str]]

    def render(self) -> str:
        width = max(len(k) for k, _ in self.rows)
        lines = [f"{k.ljust(width)}  {v}" for k, v in self.rows]
        rule = "-" * max(len(line) for line in lines)
        return "\n".join([rule, *lines, rule])


#: Prompts kept for the forwarding-lookup timing: an evenly spaced sample of about this
#: many (keeping every prompt cost ~27 KB each, 3 KB per entry on testbed-3region).
LATENCY_SAMPLE = 2000


def _synthetic_entries(
    topology: Topology, target_entries: int, seed: int
) -> tuple[dict[TableKey, dict[int, int]], list[np.ndarray], int, int]:
    """Packed values per table (one shard) from synthetic prompt families, an evenly
    spaced sample of the prompts, how many prompts there were, and the entries."""
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    plan = plan_levels(topology)
    layout = IndexLayout.from_topology(topology)
    ns = Namespace("demo-model")
    tables: dict[TableKey, dict[int, int]] = defaultdict(dict)
    workers = topology.workers
    prompts: list[np.ndarray] = []  # every stride-th prompt; the stride doubles as it fills
    stride, n_prompts = 1, 0
    entries = 0
    families = [
        rng.integers(0, 128_000, int(rng.integers(256, 4096)), dtype=np.uint32) for _ in range(512)
    ]
    while entries < target_entries:
        family = families[int(rng.integers(0, len(families)))]
        suffix = rng.integers(0, 128_000, int(rng.integers(128, 9000)), dtype=np.uint32)
        prompt = np.concatenate([family, suffix])
        if n_prompts % stride == 0:
            prompts.append(prompt)
            if len(prompts) == 2 * LATENCY_SAMPLE:
                prompts, stride = prompts[::2], 2 * stride
        n_prompts += 1
        for _ in range(pick.randint(1, 3)):
            w = workers[pick.randrange(len(workers))]
            tier = Tier.VRAM if pick.random() < 0.7 else Tier.DRAM
            table_id, field = layout.slots[w.index]
            keys = prefix_keys(prompt, plan.registration_lengths[w.region], ns)
            table = tables[(0, table_id)]
            for key in keys.values():
                old = table.get(key, 0)
                if old == 0:
                    entries += 1
                table[key] = with_tier(old, field, tier)
    return tables, prompts, n_prompts, entries


def match_latencies_us(
    view: DiscoveryView, planner: QueryPlanner, prompts: Sequence[TokenIds]
) -> NDArray[np.float64]:
    """Microseconds per forwarding lookup (keys at every level, then the match)."""
    latencies = []
    for prompt in prompts:
        t0 = time.perf_counter()
        view.match(planner.query(prompt))
        latencies.append(time.perf_counter() - t0)
    return np.array(latencies) * 1e6


def run_index_demo(
    topology_name: str = "testbed-3region",
    entries: int = 1_000_000,
    fingerprint_bits: int | None = None,
    seed: int = 7,
) -> DemoReport:
    topology = load_builtin(topology_name)
    layout = IndexLayout.from_topology(topology)
    fp_bits = topology.index.fingerprint_bits if fingerprint_bits is None else fingerprint_bits
    t0 = time.perf_counter()
    per_table, prompts, n_prompts, n_entries = _synthetic_entries(topology, entries, seed)
    t_gen = time.perf_counter() - t0

    t0 = time.perf_counter()
    rng = random.Random(seed)
    maint: dict[TableKey, LudoTable] = {}
    for where, mapping in per_table.items():
        keys = np.fromiter(mapping.keys(), dtype=np.uint64, count=len(mapping))
        values = np.fromiter(mapping.values(), dtype=np.uint64, count=len(mapping))
        spec = layout.tables[where[1]]
        maint[where] = LudoTable.build(
            keys, values, value_bits=spec.value_bits, fingerprint_bits=fp_bits, rng=rng
        )
    for spec in layout.tables:
        maint.setdefault(
            (0, spec.table_id),
            LudoTable.with_capacity(8, value_bits=spec.value_bits, fingerprint_bits=fp_bits),
        )
    t_build = time.perf_counter() - t0
    view = DiscoveryView.from_images(
        layout, 1, {where: t.view_image() for where, t in maint.items()}
    )

    # Batch lookups of every present key, checked against the maintenance tables.
    all_keys = {w: np.fromiter(m.keys(), dtype=np.uint64) for w, m in per_table.items()}
    t0 = time.perf_counter()
    wrong = 0
    for where, keys in all_keys.items():
        got = view.views[where].lookup_batch(keys)
        want = np.fromiter(per_table[where].values(), dtype=np.uint64, count=len(keys))
        wrong += int(np.count_nonzero(got.astype(np.uint64) != want))
    t_batch = time.perf_counter() - t0
    n_lookups = sum(len(k) for k in all_keys.values())

    # False hits: keys never inserted should name no holder.
    alien = np.random.default_rng(seed + 1).integers(0, 1 << 63, 200_000, dtype=np.uint64)
    false_hits = sum(int(np.count_nonzero(v.lookup_batch(alien))) for v in view.views.values()) / (
        len(alien) * len(view.views)
    )

    # Per-request forwarding lookups: keys at every level and region, then the match.
    plan = plan_levels(topology)
    ns = Namespace("demo-model")
    edge = topology.regions[0].name
    planner = QueryPlanner(plan, edge, ns)
    lat_us = match_latencies_us(view, planner, prompts[:: max(1, len(prompts) // LATENCY_SAMPLE)])

    view_bits = 8 * view.nbytes / n_entries
    load = n_entries / sum(t.geometry.n_cells for t in maint.values())
    rows = [
        (
            "topology",
            f"{topology.name} ({len(topology.workers)} workers, "
            f"{len(topology.regions)} regions, {len(layout.tables)} tables)",
        ),
        ("entries", f"{n_entries:,} from {n_prompts:,} synthetic prompts"),
        ("fingerprint bits", str(fp_bits)),
        ("generate / build", f"{t_gen:.1f} s / {t_build:.1f} s"),
        ("table load", f"{100 * load:.1f}% of cells"),
        ("view memory", f"{view.nbytes / 2**20:.1f} MiB = {view_bits:.1f} bits/entry"),
        ("batch lookup", f"{n_lookups / t_batch / 1e6:.2f} M keys/s ({wrong} wrong answers)"),
        (
            "forward lookup (keys + match)",
            f"P50 {np.percentile(lat_us, 50):.1f} us, P99 {np.percentile(lat_us, 99):.1f} us "
            f"from edge '{edge}'",
        ),
        ("false-hit rate (never-inserted)", f"{100 * false_hits:.2f}%"),
    ]
    return DemoReport(rows)
