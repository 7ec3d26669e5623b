"""Fig. 13: prefill tokens reused vs recomputed, per scheme (Fig. 12's focus rate).

Reused = ``reused_tokens`` (VRAM + DRAM hits the worker actually had); recomputed =
prompt − reused. Shares the Fig. 12 grid folder, so after ``report fig12`` it runs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kvcompass.loadgen.reports.common import Artefact, load_label
from kvcompass.loadgen.reports.fig12 import SCALES, cells, focus_rate
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect
from kvcompass.loadgen.sim.cell import write_cell
from kvcompass.loadgen.sim.grid import CellRunner

__all__ = ["figure", "run_fig13", "tabulate"]

COLUMNS = ("policy", "prompt_tokens", "reused_tokens", "recomputed_tokens", "reused_share")


def tabulate(runs: Mapping[str, Run]) -> list[dict[str, Any]]:
    rows = []
    for policy, run in runs.items():
        prompt = int(np.sum(run.requests["prompt_tokens"]))
        reused = int(np.sum(run.requests["reused_tokens"]))
        rows.append(
            {
                "policy": policy,
                "prompt_tokens": prompt,
                "reused_tokens": reused,
                "recomputed_tokens": prompt - reused,
                "reused_share": reused / prompt if prompt else 0.0,
            }
        )
    return rows


def figure(rows: Sequence[Mapping[str, Any]], at: str = "") -> Figure:
    """Stacked bars per scheme; ``at`` names the load in the title."""
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(rows))
    reused = np.array([r["reused_tokens"] for r in rows]) / 1e6
    recomputed = np.array([r["recomputed_tokens"] for r in rows]) / 1e6
    ax.bar(x, reused, label="reused", color="tab:green")
    ax.bar(x, recomputed, bottom=reused, label="recomputed", color="tab:gray")
    ax.set_xticks(x, [str(r["policy"]) for r in rows], rotation=45, ha="right")
    ax.set_ylabel("prefill tokens (millions)")
    ax.set_title(f"Prefill tokens reused vs recomputed{at}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return fig


def run_fig13(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    s = SCALES["fig12"]
    focus = focus_rate(s)
    grid = [c for c in cells(s, quick) if c.rate == focus]
    runs = {c.policy: r for c, r in collect(grid, out, jobs, runner).items()}
    art = Artefact("fig13", COLUMNS, tabulate(runs))
    art.meta = {"topology": s.topology, "rate": focus, "quick": quick}
    art.write(out, figure(art.rows, f" at {load_label(s.focus, focus)}"))
    return art
