"""Fig. 15: ablations, one KVCompass mechanism off at a time.

The paper measured closed-loop throughput on its testbed: what each variant can serve.
Here each variant runs in the simulator at one open-loop rate past every variant's
capacity, 2 λ0 (the pool's no-reuse capacity: KVCompass's pool is 16 % over its own
there), so what it completes per second is its capacity; below capacity every variant
completes what arrives and the shares read 100 %. Throughput is shown as a share of the
full design's, with P99 TTFT beside it in the CSV.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kvcompass.loadgen.reports.cells import paper_cell, rates_of
from kvcompass.loadgen.reports.common import Artefact, load_label
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect, mean_of
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner

__all__ = ["cells", "figure", "run_fig15", "tabulate"]

COLUMNS = ("variant", "throughput_tokens_per_s", "relative_throughput_pct", "ttft_p99_ms")
#: Fig. 15's variants: name → the :class:`kvcompass.routing.Ablations` switch it turns off.
VARIANTS = {
    "no-load-aware": "load_aware",
    "no-xregion-reuse": "xregion_reuse",
    "tier-blind": "tier_aware",
    "no-kv-migration": "migration",
}
#: The rate, in λ0: past every variant's capacity (see the module docstring).
OVERLOAD = 2.0
#: Paper Fig. 15: throughput relative to the full design (%).
PAPER = {
    "full": 100.0,
    "no-load-aware": 62.4,
    "no-xregion-reuse": 90.4,
    "tier-blind": 94.5,
    "no-kv-migration": 88.6,
}


def cells(quick: bool, topology: str = "sim-8region") -> list[Cell]:
    rate = rates_of(topology, [OVERLOAD])[0]
    n = 400 if quick else 8000
    seeds = (0,) if quick else (0, 1, 2)
    return [
        paper_cell("kvcompass", rate, s, topology=topology, requests=n, ablations=off)
        for off in ((), *((a,) for a in VARIANTS.values()))
        for s in seeds
    ]


def _variant(cell: Cell) -> str:
    return next((name for name, a in VARIANTS.items() if cell.ablations == (a,)), "full")


def tabulate(runs: Mapping[Cell, Run]) -> list[dict[str, Any]]:
    groups: dict[str, list[Run]] = {}
    for c, r in runs.items():
        groups.setdefault(_variant(c), []).append(r)
    full = mean_of(groups.get("full", []), "throughput_tokens_per_s")
    rows = []
    for variant, group in groups.items():
        tput = mean_of(group, "throughput_tokens_per_s")
        rows.append(
            {
                "variant": variant,
                "throughput_tokens_per_s": tput,
                "relative_throughput_pct": 100 * tput / full if full else float("nan"),
                "ttft_p99_ms": mean_of(group, "ttft_p99_ms"),
                "paper_pct": PAPER.get(variant, float("nan")),
            }
        )
    return rows


def figure(rows: Sequence[Mapping[str, Any]], at: str = "") -> Figure:
    """Each variant's throughput as a share of the full design's, beside the paper's;
    ``at`` names the load in the title."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = np.arange(len(rows))
    ours = [float(r["relative_throughput_pct"]) for r in rows]
    paper = [float(r.get("paper_pct", np.nan)) for r in rows]
    for offset, values, label, color in (
        (-0.2, ours, "ours (simulated)", "tab:blue"),
        (0.2, paper, "paper (testbed)", "tab:gray"),
    ):
        bars = ax.bar(x + offset, values, 0.4, label=label, color=color)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)  # the bars differ by a few per cent
    ax.set_xticks(x, [str(r["variant"]) for r in rows], rotation=20, ha="right")
    ax.set_ylabel("throughput (% of full)")
    ax.set_title(f"Ablation: one mechanism removed at a time{at}")
    ax.set_ylim(0, 125)  # room above the bars for the legend
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper center", ncol=2)
    return fig


def run_fig15(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    grid = cells(quick)
    art = Artefact("fig15", (*COLUMNS, "paper_pct"), tabulate(collect(grid, out, jobs, runner)))
    art.meta = {"topology": grid[0].topology, "rate": grid[0].rate, "quick": quick}
    art.write(out, figure(art.rows, f" at {load_label(OVERLOAD, grid[0].rate)}"))
    return art
