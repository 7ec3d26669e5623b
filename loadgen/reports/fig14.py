"""Fig. 14: per-worker load factor over time, one heatmap per scheme, with its peak.

Load factor (the simulator's, Fig. 14's definition): a worker's busy prefill time in a
sample window over the pool's mean in that window; the heatmap shows these windows (white:
the pool computed nothing in it, as while a run's last requests only decode). A
scheme's peak is the paper's §5.3 number: the hottest worker's compute (reload + prefill)
summed over the whole run, over the pool's mean (the summary's ``peak_load_factor``).
Not the mean of the window ratios: with a few requests per worker per 1-s window and
multi-second document prefills booked in the window they end, that mean is dominated by
spikes (1.5-7 for every scheme at λ0, the exactly balancing Oracle included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from kvcompass.loadgen.reports.common import Artefact, load_label
from kvcompass.loadgen.reports.fig12 import SCALES, cells, focus_rate
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect
from kvcompass.loadgen.sim.cell import write_cell
from kvcompass.loadgen.sim.grid import CellRunner

__all__ = [
    "figure",
    "load_matrix",
    "peak_load_factor",
    "peak_of",
    "pool_size",
    "run_fig14",
    "worker_compute",
]

COLUMNS = ("policy", "workers", "windows", "peak_load_factor", "hottest_worker")


def load_matrix(run: Run) -> tuple[list[str], NDArray[np.float64]]:
    """(workers, matrix[worker, window]) of load factors; a missing sample counts as 0,
    a window in which the pool computed nothing is NaN."""
    t = run.load["t_s"]
    workers = sorted({str(w) for w in run.load["worker"]})
    times = np.unique(t)
    m = np.zeros((len(workers), len(times)))
    wi = {w: i for i, w in enumerate(workers)}
    ti = np.searchsorted(times, t)
    for w, j, v in zip(run.load["worker"], ti, run.load["load_factor"], strict=True):
        m[wi[str(w)], j] = v
    return workers, m


def worker_compute(run: Run) -> dict[str, float]:
    """Each worker's compute (reload + prefill ms) over the run; only workers that served."""
    served = run.requests.get("worker")
    busy: dict[str, float] = {}
    if served is None:
        return busy
    compute = run.requests["reload_ms"] + run.requests["prefill_ms"]
    for worker, ms in zip(served, compute, strict=True):
        busy[str(worker)] = busy.get(str(worker), 0.0) + float(ms)
    return busy


def peak_load_factor(run: Run) -> tuple[float, str]:
    """The hottest worker's compute over the run ÷ the pool mean, and which worker it is.

    Workers that served nothing count in the mean (the pool is the summary's
    ``n_workers``), as in the simulator's summary.
    """
    busy = worker_compute(run)
    return peak_of(busy, pool_size(run, busy))


def pool_size(run: Run, busy: Mapping[str, float]) -> int:
    """The summary's ``n_workers`` (workers that served nothing included), or at least
    the workers that served."""
    return max(int(run.summary.get("n_workers", 0)), len(busy))


def peak_of(busy: Mapping[str, float], pool: int) -> tuple[float, str]:
    """The hottest of ``busy``'s workers over the mean of ``pool`` workers, and which."""
    if not busy:
        return float("nan"), ""
    mean = sum(busy.values()) / pool
    hottest = max(busy, key=busy.__getitem__)
    return (busy[hottest] / mean if mean > 0 else 1.0), hottest


def figure(runs: Mapping[str, Run], at: str = "") -> Figure:
    """A heatmap per scheme (worker × 1-s window); ``at`` names the load in the title."""
    n = max(len(runs), 1)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, layout="constrained"
    )
    vmax = 2.0
    cmap = plt.get_cmap("magma").with_extremes(bad="white")  # the pool computed nothing
    image = None
    for ax, (policy, run) in zip(axes.flat, runs.items(), strict=False):
        _, m = load_matrix(run)
        image = ax.imshow(m, aspect="auto", cmap=cmap, vmin=0, vmax=vmax, origin="lower")
        peak, _ = peak_load_factor(run)
        ax.set_title(f"{policy} (peak {peak:.2f})", fontsize=9)
        ax.set_xlabel("window")
        ax.set_ylabel("worker")
    for ax in list(axes.flat)[len(runs) :]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="load factor", shrink=0.8)
    if at:
        fig.suptitle(f"Per-worker load factor{at}")
    return fig


def run_fig14(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    s = SCALES["fig12"]
    focus = focus_rate(s)
    grid = [c for c in cells(s, quick) if c.rate == focus]
    runs = {c.policy: r for c, r in collect(grid, out, jobs, runner).items()}
    rows: list[dict[str, Any]] = []
    for policy, run in runs.items():
        workers, m = load_matrix(run)
        peak, hottest = peak_load_factor(run)
        rows.append(
            {
                "policy": policy,
                "workers": len(workers),
                "windows": m.shape[1],
                "peak_load_factor": peak,
                "hottest_worker": hottest,
            }
        )
    art = Artefact("fig14", COLUMNS, rows)
    art.meta = {
        "topology": s.topology,
        "rate": focus,
        "quick": quick,
        "peak": "hottest worker's compute over the run / the pool mean (paper §5.3)",
    }
    art.write(out, figure(runs, f" at {load_label(s.focus, focus)}"))
    return art
