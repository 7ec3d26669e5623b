"""Fig. 2 / Fig. 19: share of reusable prefixes cached only in another region at arrival.

Paper (§2.1 on WildChat, App. D on Mooncake/Qwen-Bailian): replay first-turn requests in
arrival order, each root session assigned to a region by population share (follow-up
turns inherit it), and classify each reusable prefix of at least ``min_tokens`` tokens
as cold (cached nowhere), local (cached in the request's region) or remote-only (cached
only in other regions). We run the Mooncake traces (the only ones here with block
identity) over a topology's regions, weighted by worker count (the topologies carry no
population figures), with the infinite-cache assumption of :mod:`.reuse`, over seeds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.reuse import Arrival, replay
from kvcompass.loadgen.workloads import RegionShares, TraceRecord, read_trace, trace_sessions
from kvcompass.topology import load_builtin

__all__ = ["ReuseCounts", "classify", "run_fig2"]

TRACES = ("mooncake_conversation_trace.jsonl.gz", "mooncake_synthetic_trace.jsonl.gz")
COLUMNS = (
    "trace",
    "seed",
    "requests",
    "reusable",
    "local",
    "remote_only",
    "remote_only_share",
    "remote_only_token_share",
)


@dataclass
class ReuseCounts:
    """Classified reusable prefixes (counts, and tokens of the longest match)."""

    requests: int = 0
    local: int = 0
    remote_only: int = 0
    local_tokens: int = 0
    remote_only_tokens: int = 0

    @property
    def reusable(self) -> int:
        return self.local + self.remote_only

    @property
    def remote_only_share(self) -> float:
        return self.remote_only / self.reusable if self.reusable else 0.0

    @property
    def remote_only_token_share(self) -> float:
        total = self.local_tokens + self.remote_only_tokens
        return self.remote_only_tokens / total if total else 0.0


def classify(
    arrivals: Iterable[Arrival], min_tokens: int, first_turns_only: bool = True
) -> ReuseCounts:
    """Local when the origin region holds ≥ ``min_tokens`` of the prompt; remote-only
    when it does not but another region does; otherwise cold (counted in requests only)."""
    counts = ReuseCounts()
    for a in arrivals:
        if first_turns_only and not a.first_turn:
            continue
        counts.requests += 1
        best = max(a.matched_tokens.values(), default=0)
        if best < min_tokens:
            continue
        if a.matched_tokens[a.origin] >= min_tokens:
            counts.local += 1
            counts.local_tokens += best
        else:
            counts.remote_only += 1
            counts.remote_only_tokens += best
    return counts


def _figure(rows: Sequence[dict[str, object]], traces: Sequence[str]) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    means, errs = [], []
    for trace in traces:
        shares = np.array([float(str(r["remote_only_share"])) for r in rows if r["trace"] == trace])
        means.append(100 * shares.mean())
        errs.append(100 * shares.std())
    x = np.arange(len(traces))
    ax.bar(x, means, yerr=errs, capsize=4, color="tab:blue")
    for xi, m in zip(x, means, strict=True):
        ax.text(float(xi), m + 1, f"{m:.1f}%", ha="center", va="bottom")
    ax.set_xticks(x, [t.split("_")[1] for t in traces])
    ax.set_ylabel("reusable prefixes cached only\nin another region (%)")
    ax.set_title("Cross-region-only reuse at arrival (mean ± sd over seeds)")
    ax.set_ylim(0, max([*means, 1.0]) * 1.3)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def run_fig2(
    traces_dir: Path,
    out: Path,
    *,
    seeds: int = 20,
    topology: str = "sim-16region",
    min_tokens: int = 1024,
    limit: int | None = None,
    first_turns_only: bool = True,
) -> Artefact:
    topo = load_builtin(topology)
    shares = RegionShares.of(topo)
    art = Artefact("fig2", COLUMNS)
    for name in TRACES:
        records: list[TraceRecord] = read_trace(traces_dir / name, limit=limit)
        sessions = trace_sessions(records, 512)
        for seed in range(seeds):
            c = classify(replay(records, sessions, shares, seed, 512), min_tokens, first_turns_only)
            art.rows.append(
                {
                    "trace": name.removesuffix(".jsonl.gz"),
                    "seed": seed,
                    "requests": c.requests,
                    "reusable": c.reusable,
                    "local": c.local,
                    "remote_only": c.remote_only,
                    "remote_only_share": c.remote_only_share,
                    "remote_only_token_share": c.remote_only_token_share,
                }
            )
    traces = [n.removesuffix(".jsonl.gz") for n in TRACES]
    art.meta = {
        "topology": topology,
        "regions": len(shares.regions),
        "region_weights": "worker count per region",
        "min_tokens": min_tokens,
        "seeds": seeds,
        "first_turns_only": first_turns_only,
        "cache": "infinite per region (every prefilled full block kept, no eviction)",
        "mean_remote_only_share": {
            t: float(np.mean([r["remote_only_share"] for r in art.rows if r["trace"] == t]))
            for t in traces
        },
    }
    art.write(out, _figure(art.rows, traces))
    return art
