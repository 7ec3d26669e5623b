"""KVCompass as shipped against the paper's score over Fig. 12's and Fig. 16's grids.

The figures reproduce the paper's score (``paper_cell`` pins the settings below off).
KVCompass as the router ships it goes beyond the paper four times, all ``RoutingConfig``
defaults: a worker in another region is charged ``remote_margin_rtt`` more round trips
(its queue estimate is stale; see :mod:`.margin`); a prefix the edge has just sent to a
worker of its own region is credited there until the index reports it
(``pending_credit``; :mod:`kvcompass.routing.pending`); a worker's index hit counts
only where it extends the worker's hits at shorter lengths (``prefix_chain``; most false
locators of the keyless index do not); and the capacity price is steeper (``tau_ms``,
``lambda_max``: once no worker is idle, recomputation is priced far above queueing).
This report runs KVCompass as
shipped at every point of both figures' grids (sim-8region and sim-16region; Mixed,
WildChat and LMSYS; every rate; seed 0) and, per point, compares both KVCompass variants
with the best of the other ten schemes there: is KVCompass's P99 TTFT the lowest of all,
its throughput the highest? The other schemes' cells are Fig. 12's and Fig. 16's own,
reused when the reports share ``--out``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kvcompass.loadgen.reports import fig12
from kvcompass.loadgen.reports.cells import PAPER_ROUTING, WORKLOADS, rates_of
from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner
from kvcompass.routing import RoutingConfig

__all__ = ["SHIPPED", "cells", "counts", "figure", "run_shipped_grid", "tabulate"]

OURS = "kvcompass"
#: The cell settings the router ships: remote margin (round trips), pending credit, prefix
#: chain and capacity price.
SHIPPED: dict[str, Any] = {
    "remote_margin_rtt": RoutingConfig.remote_margin_rtt,
    "pending_credit": RoutingConfig.pending_credit,
    "prefix_chain": RoutingConfig.prefix_chain,
    "tau_ms": RoutingConfig.tau_ms,
    "lambda_max": RoutingConfig.lambda_max,
}
SHIPPED_LABEL = (
    f"shipped (m = {RoutingConfig.remote_margin_rtt:g}"
    + (", pending credit" if RoutingConfig.pending_credit else "")
    + (", prefix chain" if RoutingConfig.prefix_chain else "")
    + f", τ {RoutingConfig.tau_ms:g} ms, λmax {RoutingConfig.lambda_max:g})"
)
SCALES = (fig12.SCALES["fig12"], fig12.SCALES["fig16"])
COLUMNS = (
    "topology",
    "workload",
    "load",
    "rate",
    "best_other_p99_ms",
    "best_other_p99_policy",
    "paper_p99_ms",
    "shipped_p99_ms",
    "paper_lowest_p99",
    "shipped_lowest_p99",
    "best_other_req_per_s",
    "paper_req_per_s",
    "shipped_req_per_s",
    "paper_highest_throughput",
    "shipped_highest_throughput",
    "paper_cross_region_share",
    "shipped_cross_region_share",
)


def cells(quick: bool) -> list[Cell]:
    """Both figures' cells (the paper's score), and KVCompass's as shipped at each of
    their points."""
    grid = []
    for scale in SCALES:
        base = fig12.cells(scale, quick, WORKLOADS)
        shipped = [replace(c, **SHIPPED) for c in base if c.policy == OURS]
        grid += base + shipped
    return grid


def tabulate(runs: Mapping[Cell, Run]) -> list[dict[str, Any]]:
    """One row per (topology, workload, rate): the best other scheme's P99 and throughput,
    and KVCompass's with the paper's score and as shipped."""
    points: dict[tuple[str, str, float], dict[str, Any]] = {}
    for cell, run in runs.items():
        at = points.setdefault((cell.topology, cell.workload, cell.rate), {"others": {}})
        if cell.policy != OURS:
            at["others"][cell.policy] = run.summary
        elif _has(cell, PAPER_ROUTING):
            at["paper"] = run.summary
        elif _has(cell, SHIPPED):
            at["shipped"] = run.summary
    order = {s.topology: i for i, s in enumerate(SCALES)}
    rows = []
    for (topology, workload, rate), at in sorted(
        points.items(), key=lambda p: (order.get(p[0][0], len(order)), _place(p[0][1]), p[0][2])
    ):
        others, paper, shipped = at["others"], at.get("paper"), at.get("shipped")
        if not others or paper is None or shipped is None:
            continue
        best = min(others, key=lambda p: float(others[p]["ttft_p99_ms"]))
        best_p99 = float(others[best]["ttft_p99_ms"])
        best_thr = max(float(s["throughput_req_per_s"]) for s in others.values())
        (unit,) = rates_of(topology, [1.0], workload)
        row: dict[str, Any] = {
            "topology": topology,
            "workload": workload,
            "load": round(rate / unit, 2),
            "rate": rate,
            "best_other_p99_ms": best_p99,
            "best_other_p99_policy": best,
            "best_other_req_per_s": best_thr,
        }
        for name, summary in (("paper", paper), ("shipped", shipped)):
            p99, thr = float(summary["ttft_p99_ms"]), float(summary["throughput_req_per_s"])
            row[f"{name}_p99_ms"] = p99
            row[f"{name}_lowest_p99"] = p99 < best_p99
            row[f"{name}_req_per_s"] = thr
            row[f"{name}_highest_throughput"] = thr > best_thr
            row[f"{name}_cross_region_share"] = float(summary["cross_region_share"])
        rows.append(row)
    return rows


def _has(cell: Cell, settings: Mapping[str, Any]) -> bool:
    return all(getattr(cell, name) == value for name, value in settings.items())


def _place(workload: str) -> int:
    return WORKLOADS.index(workload) if workload in WORKLOADS else len(WORKLOADS)


def counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per topology and in total: points, and at how many each variant is lowest on P99
    TTFT and highest on throughput."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        for key in (str(row["topology"]), "total"):
            c = out.setdefault(key, dict.fromkeys(_COUNTED, 0) | {"points": 0})
            c["points"] += 1
            for name in _COUNTED:
                c[name] += bool(row[name])
    return out


_COUNTED = (
    "paper_lowest_p99",
    "shipped_lowest_p99",
    "paper_highest_throughput",
    "shipped_highest_throughput",
)


def figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    topologies = list(dict.fromkeys(str(r["topology"]) for r in rows))
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(
        len(topologies), len(workloads), figsize=(4.6 * len(workloads), 3.6 * len(topologies))
    )
    tally = counts(rows)
    for i, topology in enumerate(topologies):
        for j, workload in enumerate(workloads):
            ax = axes[i][j] if len(topologies) > 1 else axes[j]
            mine = sorted(
                (r for r in rows if r["topology"] == topology and r["workload"] == workload),
                key=lambda r: r["load"],
            )
            x = [r["load"] for r in mine]
            for name, label in (("paper", "paper's score"), ("shipped", SHIPPED_LABEL)):
                y = [r[f"{name}_p99_ms"] / r["best_other_p99_ms"] for r in mine]
                ax.plot(x, y, marker="o", label=label)
            ax.axhline(1.0, color="black", lw=1)
            ax.set_xscale("log")
            ax.set_xticks(x, [f"{v:g}" for v in x], fontsize=7)
            ax.minorticks_off()
            ax.set_title(f"{topology}, {workload}", fontsize=10)
            ax.set_xlabel("load (× λ0)")
            ax.set_ylabel("P99 TTFT ÷ best other scheme's")
            ax.grid(True, alpha=0.3)
    # One legend for all panels, below them: per panel it would hide their points.
    handles, labels = (axes[0][0] if len(topologies) > 1 else axes[0]).get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9)
    fig.set_layout_engine("tight", rect=(0, 0.05, 1, 0.95))
    total = tally.get("total", {})
    fig.suptitle(
        "KVCompass's P99 TTFT over the best of the ten other schemes (below 1: lowest of all); "
        f"lowest at {total.get('paper_lowest_p99', 0)} (paper's score) and "
        f"{total.get('shipped_lowest_p99', 0)} (shipped) of {total.get('points', 0)} points",
        fontsize=10,
    )
    return fig


def run_shipped_grid(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    grid = cells(quick)
    art = Artefact("shipped-grid", COLUMNS, tabulate(collect(grid, out, jobs, runner)))
    art.meta = {
        "shipped": SHIPPED,
        "topologies": [s.topology for s in SCALES],
        "workloads": list(WORKLOADS),
        "quick": quick,
        "counts": counts(art.rows),
    }
    art.write(out, figure(art.rows))
    return art
