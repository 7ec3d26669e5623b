"""Beyond the paper: which capacity price KVCompass ships, over Figs. 12 and 16's grids.

The capacity price λ = min(λmax, least queue estimate / τ) is the paper's (§3.4); it
fixes λmax = 8 for its testbed and leaves τ open (``routing.PAPER_PRICE`` is our
reading: 350 ms). This report runs KVCompass with the router's other shipped settings
(remote margin, pending credit, prefix chain) at each (τ, λmax) of ``PRICES`` over every
point of ``shipped-grid`` (sim-8region and sim-16region; Mixed, WildChat and LMSYS; every
rate; seed 0) and counts, per price, the points where it has the lowest P99 TTFT and the
highest throughput of all schemes. The other schemes' cells, and KVCompass's at the
shipped price, are ``shipped-grid``'s, reused when both share ``--out``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kvcompass.loadgen.reports import shipped_grid
from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner
from kvcompass.routing import PAPER_PRICE, RoutingConfig

__all__ = ["PAPER", "PRICES", "SHIPPED", "cells", "figure", "run_price", "tabulate"]

#: (τ ms, λmax) of the paper's evaluation and of the router.
PAPER = (PAPER_PRICE["tau_ms"], PAPER_PRICE["lambda_max"])
SHIPPED = (RoutingConfig.tau_ms, RoutingConfig.lambda_max)
#: The paper's price, steeper slopes with a higher cap, the steep slope under the
#: paper's cap, and what the router ships.
PRICES: tuple[tuple[float, float], ...] = (
    PAPER,
    (100.0, 80.0),
    (35.0, 80.0),
    (10.0, PAPER[1]),
    SHIPPED,
)
COLUMNS = (
    "tau_ms",
    "lambda_max",
    "shipped",
    "points",
    "lowest_p99",
    "highest_throughput",
    "median_p99_over_best_other",
    "median_req_per_s_over_best_other",
)


def prices(quick: bool) -> tuple[tuple[float, float], ...]:
    return (PAPER, SHIPPED) if quick else PRICES


def cells(quick: bool) -> list[Cell]:
    """``shipped-grid``'s cells, and KVCompass's as shipped at every other price."""
    grid = shipped_grid.cells(quick)
    shipped = [c for c in grid if c.policy == shipped_grid.OURS and _shipped_but_price(c)]
    for tau_ms, lambda_max in prices(quick):
        grid += [
            replace(c, tau_ms=tau_ms, lambda_max=lambda_max)
            for c in shipped
            if (c.tau_ms, c.lambda_max) != (tau_ms, lambda_max)
        ]
    return grid


def _shipped_but_price(cell: Cell) -> bool:
    """Has the router's settings except perhaps the price."""
    return all(
        getattr(cell, name) == value
        for name, value in shipped_grid.SHIPPED.items()
        if name not in PAPER_PRICE
    )


def tabulate(runs: Mapping[Cell, Run]) -> list[dict[str, Any]]:
    """One row per price: at how many points KVCompass beats every other scheme."""
    others: dict[tuple[str, str, float], list[Mapping[str, Any]]] = {}
    ours: dict[tuple[float, float], dict[tuple[str, str, float], Mapping[str, Any]]] = {}
    for cell, run in runs.items():
        point = (cell.topology, cell.workload, cell.rate)
        if cell.policy != shipped_grid.OURS:
            others.setdefault(point, []).append(run.summary)
        elif _shipped_but_price(cell):
            ours.setdefault((cell.tau_ms, cell.lambda_max), {})[point] = run.summary
    rows = []
    for price in sorted(ours, key=lambda p: (-p[0], p[1])):
        points = [p for p in ours[price] if others.get(p)]
        p99_ratio, thr_ratio = [], []
        lowest = highest = 0
        for p in points:
            mine = ours[price][p]
            best_p99 = min(float(s["ttft_p99_ms"]) for s in others[p])
            best_thr = max(float(s["throughput_req_per_s"]) for s in others[p])
            p99, thr = float(mine["ttft_p99_ms"]), float(mine["throughput_req_per_s"])
            lowest += p99 < best_p99
            highest += thr > best_thr
            # A --quick cell can finish nothing inside its short arrival window
            # (throughput 0): no ratio there, rather than a division by zero.
            if best_p99 > 0:
                p99_ratio.append(p99 / best_p99)
            if best_thr > 0:
                thr_ratio.append(thr / best_thr)
        rows.append(
            {
                "tau_ms": price[0],
                "lambda_max": price[1],
                "shipped": price == SHIPPED,
                "points": len(points),
                "lowest_p99": lowest,
                "highest_throughput": highest,
                "median_p99_over_best_other": _median(p99_ratio),
                "median_req_per_s_over_best_other": _median(thr_ratio),
            }
        )
    return rows


def _median(values: Sequence[float]) -> float:
    return round(float(np.median(values)), 4) if values else float("nan")


def figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    fig, (counted, ratios) = plt.subplots(1, 2, figsize=(12, 3.8))
    labels = [
        f"τ {r['tau_ms']:g} ms\nλmax {r['lambda_max']:g}" + ("\n(shipped)" if r["shipped"] else "")
        for r in rows
    ]
    x = np.arange(len(rows))
    points = max((int(r["points"]) for r in rows), default=0)
    for offset, key, name in (
        (-0.2, "lowest_p99", "lowest P99 TTFT"),
        (0.2, "highest_throughput", "highest throughput"),
    ):
        bars = counted.bar(x + offset, [r[key] for r in rows], width=0.4, label=name)
        counted.bar_label(bars, fontsize=8)
    # The counts differ by a point or two: start the axis near them (the labels say so).
    low = min((min(int(r["lowest_p99"]), int(r["highest_throughput"])) for r in rows), default=0)
    counted.set_ylim(max(0, low - 5), points + 1)
    counted.axhline(points, color="black", lw=1)
    counted.set_xticks(x, labels, fontsize=8)
    counted.set_ylabel(f"points of {points} where KVCompass is best")
    counted.set_title("points where KVCompass beats every other scheme", fontsize=10)
    counted.legend(fontsize=8, loc="lower left")
    for key, name in (
        ("median_p99_over_best_other", "P99 TTFT"),
        ("median_req_per_s_over_best_other", "throughput"),
    ):
        ratios.plot(x, [r[key] for r in rows], marker="o", label=name)
    ratios.axhline(1.0, color="black", lw=1)
    ratios.set_xticks(x, labels, fontsize=8)
    ratios.set_ylabel("KVCompass ÷ best other scheme (median)")
    ratios.set_title("median over the points", fontsize=10)
    ratios.grid(True, alpha=0.3)
    ratios.legend(fontsize=8)
    fig.suptitle(
        "KVCompass (margin, pending credit, prefix chain) at each capacity price "
        "λ = min(λmax, least queue / τ), Figs. 12 + 16's points",
        fontsize=10,
    )
    return fig


def run_price(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    art = Artefact("price", COLUMNS, tabulate(collect(cells(quick), out, jobs, runner)))
    art.meta = {"prices": [list(p) for p in prices(quick)], "quick": quick}
    art.write(out, figure(art.rows))
    return art
