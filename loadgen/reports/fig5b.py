"""Fig. 5b: latency-derived index levels vs latency-blind fixed grids, by table budget.

A match of m tokens held in region r, seen from edge o, is worth β_r·c − RTT(o, r) when
the index credits it at c (the longest indexed length ≤ m toward r), and nothing when
that is not positive: forwarding would cost more than the prefill it saves. The exact
index (every length) gets β_r·m − RTT; a level plan's score is the share of that upper
bound it captures, summed over requests, each at its best *other* region: plans differ
in how they treat distance, and the own region (RTT ≈ 1 ms) would swamp that.

Matches come from replaying a Mooncake trace over the topology's regions (:mod:`.reuse`),
so m moves in 512-token blocks, which favours grids of 512 multiples. The paper used
WildChat's reuse distribution, which is not here. Mooncake's matches run far longer
(tens of thousands of tokens), past the paper's last equal step (3.5·n1), which is why
the plan that goes on doubling after its L steps (``[index] long_context_levels``) is
shown beside it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kvcompass.levels import plan_levels
from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.reuse import Arrival, replay
from kvcompass.loadgen.workloads import RegionShares, read_trace, trace_sessions
from kvcompass.topology import Topology, load_builtin

__all__ = ["Grid", "captured_share", "fixed_grid", "latency_grid", "run_fig5b"]

#: Level lengths toward a target region, seen from an edge region.
Grid = Callable[[str, str], Sequence[int]]
COLUMNS = ("scheme", "levels", "captured_share")


def latency_grid(topology: Topology, levels: int, long_context: bool = False) -> Grid:
    """The paper's plan with ``levels`` levels; with ``long_context``, the first
    min(levels, topology's L) equal steps, then doublings, ``levels`` lengths in all."""
    if not long_context:
        plan = plan_levels(topology, levels=levels, long_context=False)
        return lambda o, r: plan.query_lengths[o, r]
    steps = min(levels, topology.index.levels)
    plan = plan_levels(topology, levels=steps, long_context=True)
    return lambda o, r: plan.query_lengths[o, r][:levels]


def fixed_grid(lengths: Sequence[int]) -> Grid:
    fixed = tuple(sorted(lengths))
    return lambda o, r: fixed


def _worth(topology: Topology, o: str, r: str, tokens: int) -> float:
    return max(0.0, topology.region(r).beta_ms_per_token * tokens - topology.rtt_ms(o, r))


def captured_share(
    topology: Topology, arrivals: Iterable[Arrival], grid: Grid, remote_only: bool = True
) -> float:
    """Σ best credited worth / Σ best exact worth over requests (see the module doc);
    ``remote_only``: only holders in other regions count (where the levels differ)."""
    got = bound = 0.0
    for a in arrivals:
        best_exact = best_grid = 0.0
        for r, m in a.matched_tokens.items():
            if m <= 0 or (remote_only and r == a.origin):
                continue
            best_exact = max(best_exact, _worth(topology, a.origin, r, m))
            lengths = grid(a.origin, r)
            i = bisect.bisect_right(lengths, m)
            if i:
                best_grid = max(best_grid, _worth(topology, a.origin, r, lengths[i - 1]))
        got += best_grid
        bound += best_exact
    return got / bound if bound else 0.0


def _figure(rows: Sequence[dict[str, object]]) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for scheme in dict.fromkeys(str(r["scheme"]) for r in rows):
        pts = [(int(str(r["levels"])), float(str(r["captured_share"]))) for r in rows]
        pts = [p for p, r in zip(pts, rows, strict=True) if r["scheme"] == scheme]
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=scheme)
    ax.set_xlabel("levels per (edge, target region) (table budget)")
    ax.set_ylabel("share of exact-match worth (%)")
    ax.set_title("Latency-derived levels vs fixed grids")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def run_fig5b(
    traces_dir: Path,
    out: Path,
    *,
    topology: str = "sim-8region",
    max_levels: int = 10,
    limit: int | None = None,
    seed: int = 0,
) -> Artefact:
    topo = load_builtin(topology)
    records = read_trace(traces_dir / "mooncake_conversation_trace.jsonl.gz", limit=limit)
    arrivals = list(replay(records, trace_sessions(records, 512), RegionShares.of(topo), seed, 512))
    schemes: dict[str, Callable[[int], Grid]] = {
        "latency-derived (n1 + k·n1/2)": lambda n: latency_grid(topo, n),
        "latency-derived, then doubling": lambda n: latency_grid(topo, n, long_context=True),
        "fixed 512·k": lambda n: fixed_grid([512 * (k + 1) for k in range(n)]),
        "fixed 256·2^k": lambda n: fixed_grid([256 * 2**k for k in range(n)]),
        "fixed 1024·k": lambda n: fixed_grid([1024 * (k + 1) for k in range(n)]),
    }
    art = Artefact("fig5b", COLUMNS)
    for name, make in schemes.items():
        for n in range(1, max_levels + 1):
            share = captured_share(topo, arrivals, make(n))
            art.rows.append({"scheme": name, "levels": n, "captured_share": share})
    art.meta = {
        "topology": topology,
        "trace": "mooncake_conversation_trace (512-token blocks)",
        "requests": len(arrivals),
        "seed": seed,
        "cache": "infinite per region (see reports/reuse.py)",
        "worth": "max(0, beta_r * credited_tokens - RTT(o, r)), best region per request",
    }
    art.write(out, _figure(art.rows))
    return art
