"""Table 4: KVCompass's sensitivity to WAN jitter, index update loss and update delay.

Beyond the paper (which admits no guaranteed recovery from lost updates), the loss rows
run again with the edges' gap detection + resync on; and the base and loss rows run
again with the shipped prefix chain (``RoutingConfig.prefix_chain``), whose one failure
mode is a lost key in the middle of a holder's chain. Hit rate = share of prompt tokens
reused; false lookups = share of claimed matches the chosen worker did not fully hold.
The simulator's jitter is a uniform factor in [1 − p, 1 + p] with p < 100%, so the
paper's ±100% row is run at ±99%. The rate is the pool's no-reuse capacity λ0 (the
paper's 3000 req/s is near its pool's capacity; see :mod:`.fig12` on absolute rates).
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
from kvcompass.loadgen.reports.sweep import collect
from kvcompass.loadgen.reports.table5 import false_lookup_share
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner

__all__ = ["cells", "run_table4", "tabulate"]

COLUMNS = (
    "variant",
    "resync",
    "prefix_chain",
    "ttft_p99_ms",
    "hit_rate_pct",
    "false_lookups_pct",
)


def _variants() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{}]
    out += [{"jitter_pct": float(p)} for p in (25, 50, 99)]
    losses = [{"update_loss": p, "resync": r} for r in (False, True) for p in (0.1, 0.2, 0.3)]
    out += losses
    out += [{"update_delay_ms": float(d)} for d in (100, 200, 300)]
    out += [{"prefix_chain": True, **knobs} for knobs in ({}, *losses)]
    return out


def variant(cell: Cell) -> str:
    """The row's name, from the one knob the cell changes."""
    if cell.jitter_pct:
        return f"jitter ±{cell.jitter_pct:g}%"
    if cell.update_loss:
        return f"loss {int(100 * cell.update_loss)}%"
    if cell.update_delay_ms:
        return f"delay {cell.update_delay_ms:g} ms"
    return "base"


def cells(quick: bool, topology: str = "sim-8region") -> list[Cell]:
    rate = rates_of(topology, [1.0])[0]
    n = 300 if quick else 8000
    return [
        paper_cell("kvcompass", rate, 0, topology=topology, requests=n, **knobs)
        for knobs in _variants()
    ]


def tabulate(runs: Mapping[Cell, Run]) -> list[dict[str, Any]]:
    rows = []
    for cell, run in runs.items():
        req = run.requests
        prompt = float(req["prompt_tokens"].sum())
        rows.append(
            {
                "variant": variant(cell),
                "resync": cell.resync,
                "prefix_chain": cell.prefix_chain,
                "ttft_p99_ms": float(run.summary.get("ttft_p99_ms", float("nan"))),
                "hit_rate_pct": 100 * float(req["reused_tokens"].sum()) / prompt if prompt else 0.0,
                "false_lookups_pct": 100
                * false_lookup_share(req["matched_tokens"], req["reused_tokens"]),
            }
        )
    return rows


def figure(rows: Sequence[Mapping[str, Any]], at: str = "") -> Figure:
    """One bar per variant for each of the table's three columns, its value beside it
    (the P99s differ by a few per cent: the bars alone would look equal); ``at`` names
    the load in the title."""
    panels = (
        ("ttft_p99_ms", "P99 TTFT (ms)", "tab:blue", "%.0f"),
        ("hit_rate_pct", "hit rate (% of prompt tokens reused)", "tab:green", "%.1f"),
        ("false_lookups_pct", "false lookups (% of requests)", "tab:red", "%.2f"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 5.5), sharey=True)
    labels = [
        f"{r['variant']}{' +resync' if r['resync'] else ''}{' +chain' if r['prefix_chain'] else ''}"
        for r in rows
    ]
    y = np.arange(len(rows))
    for ax, (column, label, color, fmt) in zip(axes, panels, strict=True):
        values = [float(r[column]) for r in rows]
        bars = ax.barh(y, values, color=color)
        ax.bar_label(bars, fmt=fmt, fontsize=8, padding=2)
        ax.set_xlim(0, 1.2 * max(values, default=1.0))  # room for the labels
        ax.set_xlabel(label)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels)
    axes[0].invert_yaxis()  # shared: the first row on top in every panel
    fig.suptitle(f"KVCompass under WAN jitter, update loss and update delay{at}")
    return fig


def run_table4(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    grid = cells(quick)
    art = Artefact("table4", COLUMNS, tabulate(collect(grid, out, jobs, runner)))
    art.meta = {
        "topology": grid[0].topology,
        "rate": grid[0].rate,
        "quick": quick,
        "paper": "Mixed, 3000 req/s; ±100% jitter <2% P99 change; 30% loss −2.5 pp hit",
    }
    art.write(out, figure(art.rows, f" at {load_label(1.0, grid[0].rate)}"))
    return art
