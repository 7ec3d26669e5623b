"""Helpers the simulator-based reports share: run cells, group runs, plot distributions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from numpy.typing import NDArray

from kvcompass.loadgen.reports.runs import Run, load_run
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner, run_grid

__all__ = ["collect", "color_of", "mean_of", "plot_cdf", "policies", "rate_rows"]


def policies() -> tuple[str, ...]:
    """Every routing policy this checkout has (the baselines land over time)."""
    from kvcompass.routing import POLICY_NAMES

    return tuple(POLICY_NAMES)


def color_of(policy: str) -> tuple[float, float, float, float]:
    """One colour per policy in every panel and figure: tab10 in POLICY_NAMES order, then
    black and greys (eleven schemes exceed the default cycle of ten)."""
    from matplotlib import colormaps

    names = policies()
    i = names.index(policy) if policy in names else len(names)
    if i < 10:
        return tuple(colormaps["tab10"](i))  # type: ignore[return-value]
    grey = min(0.15 * (i - 10), 0.6)
    return (grey, grey, grey, 1.0)


def collect(
    cells: Sequence[Cell], out: Path, jobs: int = 1, runner: CellRunner = write_cell
) -> dict[Cell, Run]:
    """Run the missing cells under ``out/grid`` and read every cell's folder back."""
    folders = run_grid(cells, out / "grid", jobs=jobs, runner=runner, progress=True)
    return {cell: load_run(folder) for cell, folder in folders.items()}


def mean_of(runs: Sequence[Run], metric: str) -> float:
    """A summary metric averaged over seeds (NaN when missing)."""
    values = [float(r.summary.get(metric, np.nan)) for r in runs]
    return float(np.mean(values)) if values else float("nan")


def rate_rows(runs: Mapping[Cell, Run], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (policy, rate): each metric averaged over the seeds."""
    groups: dict[tuple[str, float], list[Run]] = {}
    for cell, run in runs.items():
        groups.setdefault((cell.policy, cell.rate), []).append(run)
    rows = []
    for (policy, rate), group in sorted(groups.items()):
        row: dict[str, Any] = {"policy": policy, "rate": rate, "seeds": len(group)}
        row |= {m: mean_of(group, m) for m in metrics}
        rows.append(row)
    return rows


def plot_cdf(ax: Axes, values: NDArray[np.float64], label: str) -> None:
    v = np.sort(values)
    if v.size:
        ax.step(
            v, np.arange(1, v.size + 1) / v.size, where="post", label=label, color=color_of(label)
        )
