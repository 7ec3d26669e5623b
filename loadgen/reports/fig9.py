"""Fig. 9: mean queueing delay vs offered load, simulated, beside the M/G/1 curve.

Random forwarding is the M/G/1 case (paper §3.5): each worker sees a Poisson stream of
λ/W. The curve uses the service-time moments measured in the random runs (service =
reload + prefill, the worker's prefill queue being the server), so it has no free
parameter. Least-loaded (the Oracle when present) and KVCompass show what load awareness
and reuse add.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kvcompass.loadgen.reports.cells import no_reuse_capacity, paper_cell, rates_of
from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.mg1 import pk_mean_wait_ms
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect, color_of, policies
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner

__all__ = ["cells", "run_fig9", "service_moments", "tabulate"]

COLUMNS = ("policy", "rate", "seeds", "queue_mean_ms", "mg1_ms")


def _schemes() -> list[str]:
    have = policies()
    least = "oracle" if "oracle" in have else "local-least-loaded"
    return [p for p in ("random", least, "kvcompass") if p in have]


def cells(quick: bool, topology: str = "sim-8region") -> list[Cell]:
    loads = (
        (0.25, 0.5, 0.75, 1.0) if quick else (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.25, 1.5, 1.75)
    )
    rates = rates_of(topology, loads)
    seeds = (0,) if quick else (0, 1)
    n = 300 if quick else 6000
    return [
        paper_cell(p, r, s, topology=topology, requests=n)
        for p in _schemes()
        for r in rates
        for s in seeds
    ]


def service_moments(runs: Sequence[Run]) -> tuple[float, float]:
    """(E[S], E[S²]) over every request of the given runs; S = reload + prefill (ms).
    Pooled, as §3.5 draws S from the request mix: a short run leaves a few requests per
    worker, too few for per-worker moments of a heavy-tailed S."""
    service = np.concatenate(
        [r.requests["reload_ms"] + r.requests["prefill_ms"] for r in runs] or [np.zeros(0)]
    )
    if not service.size:
        return float("nan"), float("nan")
    return float(service.mean()), float(np.square(service).mean())


def tabulate(runs: Mapping[Cell, Run], workers: int) -> list[dict[str, float | str]]:
    es, es2 = service_moments([r for c, r in runs.items() if c.policy == "random"])
    groups: dict[tuple[str, float], list[Run]] = {}
    for c, r in runs.items():
        groups.setdefault((c.policy, c.rate), []).append(r)
    rows: list[dict[str, float | str]] = []
    for (policy, rate), group in sorted(groups.items()):
        queue = float(np.mean([np.mean(r.requests["queue_ms"]) for r in group]))
        row: dict[str, float | str] = {"policy": policy, "rate": rate, "seeds": len(group)}
        row |= {"queue_mean_ms": queue, "mg1_ms": pk_mean_wait_ms(rate / workers, es, es2)}
        rows.append(row)
    return rows


def figure(rows: Sequence[Mapping[str, float | str]]) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 4))
    pols = list(dict.fromkeys(str(r["policy"]) for r in rows))
    for p in pols:
        pts = [(float(r["rate"]), float(r["queue_mean_ms"])) for r in rows if r["policy"] == p]
        ax.plot(*zip(*pts, strict=True), marker="o", label=p, color=color_of(p))
    curve = sorted({(float(r["rate"]), float(r["mg1_ms"])) for r in rows})
    curve = [(x, y) for x, y in curve if np.isfinite(y)]
    if curve:
        ax.plot(*zip(*curve, strict=True), "k--", label="M/G/1 (P–K), random")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("mean queueing delay (ms)")
    ax.set_title("Queueing delay vs offered load (simulated)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def run_fig9(out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell) -> Artefact:
    from kvcompass.topology import load_builtin

    grid = cells(quick)
    runs = collect(grid, out, jobs, runner)
    workers = len(load_builtin(grid[0].topology).workers)
    art = Artefact("fig9", COLUMNS, tabulate(runs, workers))
    art.meta = {
        "lambda0_req_per_s": no_reuse_capacity(grid[0].topology),
        "topology": grid[0].topology,
        "quick": quick,
        "workers": workers,
        "service_time": "reload_ms + prefill_ms, pooled over the random runs",
    }
    art.write(out, figure(art.rows))
    return art
