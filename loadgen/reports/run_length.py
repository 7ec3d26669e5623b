"""Beyond the paper: each scheme's P99 TTFT ratio to KVCompass's against the run's length.

The paper's §5.3 ratios (1.6× the central directory … 14× the DHTs at 3000 req/s) come
from runs of a length it does not give. A scheme that sends some worker more work than
it can do builds that worker's queue for as long as requests keep arriving, so its P99,
and its ratio to a scheme that keeps up, grows with the run; a scheme whose every worker
keeps up settles. Fig. 12's cells hold 6,000
requests (25 s at 1.5 λ0). This report runs every scheme at 1.5 λ0 on sim-8region
(Mixed, seed 0; the rate that plays the paper's 3000 req/s) at 6,000, 20,000 and 60,000
requests, and shows which ratios grow and which settle. ``pool_busy`` is the pool's
compute over its workers and the arrival window
(:func:`kvcompass.loadgen.reports.peak.peak_split`), ``hottest_busy`` the hottest
worker's: above 1 that worker receives more compute than it has time for, its queue
grows for as long as the run lasts, and so does the scheme's P99 (a scheme can do so
with the pool as a whole below 1: hash placement's hot workers). The 6,000-request cells
are Fig. 12's own, reused when both reports share ``--out``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kvcompass.loadgen.reports.cells import paper_cell, rates_of
from kvcompass.loadgen.reports.common import Artefact, load_label
from kvcompass.loadgen.reports.fig12 import PAPER_RATIOS, SCALES
from kvcompass.loadgen.reports.peak import peak_split
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import collect, color_of, policies
from kvcompass.loadgen.sim.cell import Cell, write_cell
from kvcompass.loadgen.sim.grid import CellRunner
from kvcompass.topology import load_builtin

__all__ = ["cells", "figure", "run_run_length", "tabulate"]

SCALE = SCALES["fig12"]
OURS = "kvcompass"
COLUMNS = (
    "policy",
    "requests",
    "arrival_window_s",
    "ttft_p99_ms",
    "p99_over_kvc",
    "paper_p99_over_kvc",
    "throughput_req_per_s",
    "pool_busy",
    "hottest_busy",
    "peak_load_factor",
)
#: Requests per run (full), the first being Fig. 12's cells'.
LENGTHS = (SCALE.requests, 20_000, 60_000)
#: ``--quick``: two lengths, KVCompass and one scheme on each side of its capacity.
QUICK_LENGTHS = (600, 2_000)
QUICK_POLICIES = (OURS, "skywalker", "central-directory")


def sizes(quick: bool) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The schemes and the requests per run."""
    return (QUICK_POLICIES, QUICK_LENGTHS) if quick else (policies(), LENGTHS)


def cells(quick: bool) -> list[Cell]:
    schemes, lengths = sizes(quick)
    (rate,) = rates_of(SCALE.topology, [SCALE.focus])
    return [
        paper_cell(p, rate, 0, topology=SCALE.topology, requests=n)
        for n in lengths
        for p in schemes
    ]


def tabulate(runs: Mapping[Cell, Run]) -> list[dict[str, Any]]:
    """One row per (scheme, run length), KVCompass first, shorter runs first."""
    workers_in = Counter(w.region for w in load_builtin(SCALE.topology).workers)
    ours = {c.requests: r.summary["ttft_p99_ms"] for c, r in runs.items() if c.policy == OURS}
    rows: list[dict[str, Any]] = []
    for cell, run in runs.items():
        summary = run.summary
        p99 = float(summary["ttft_p99_ms"])
        arrivals = run.requests["arrival_s"]
        own = float(ours.get(cell.requests, "nan"))
        split = peak_split(run, workers_in)
        rows.append(
            {
                "policy": cell.policy,
                "requests": cell.requests,
                "arrival_window_s": float(arrivals.max() - arrivals.min()),
                "ttft_p99_ms": p99,
                "p99_over_kvc": p99 / own,
                "paper_p99_over_kvc": PAPER_RATIOS.get(cell.policy, float("nan")),
                "throughput_req_per_s": float(summary["throughput_req_per_s"]),
                "pool_busy": split.pool_busy,
                "hottest_busy": split.hottest_busy,
                "peak_load_factor": float(summary["peak_load_factor"]),
            }
        )
    order = {p: i for i, p in enumerate(policies())}  # KVCompass first
    rows.sort(key=lambda r: (order.get(r["policy"], len(order)), r["requests"]))
    return rows


def figure(rows: Sequence[Mapping[str, Any]], at: str = "") -> Figure:
    """Left: each scheme's P99 ratio to KVCompass's by run length, dashed where the
    scheme's hottest worker was past its capacity in the longest run, with the paper's
    ratio as a star at the right edge; right: the P99s themselves."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6), layout="constrained")
    by_policy: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_policy.setdefault(str(r["policy"]), []).append(r)
    longest = max((int(r["requests"]) for r in rows), default=1)
    stars = 0
    for policy, series in by_policy.items():
        series = sorted(series, key=lambda r: int(r["requests"]))
        n = [int(r["requests"]) for r in series]
        color = color_of(policy)
        past = float(series[-1]["hottest_busy"]) > 1.0
        style = "--" if past else "-"
        right.plot(n, [r["ttft_p99_ms"] for r in series], style, marker="o", color=color)
        if policy == OURS:
            continue
        label = f"{policy} (hottest worker past capacity)" if past else policy
        ratios = [r["p99_over_kvc"] for r in series]
        left.plot(n, ratios, style, marker="o", color=color, label=label)
        paper = float(series[0]["paper_p99_over_kvc"])
        if paper == paper:  # not NaN: the paper gives this scheme a ratio
            stars += 1  # side by side: the two hash-placement schemes share 14×
            left.plot([longest * (1.3 + 0.15 * stars)], [paper], "*", ms=11, color=color)
    left.axhline(1.0, color="black", lw=0.8)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("requests per run (★: the paper's ratio at 3000 req/s)")
    left.set_ylabel("P99 TTFT ÷ KVCompass's")
    left.set_title(f"P99 ratio to KVCompass by run length{at}")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("requests per run")
    right.set_ylabel("P99 TTFT (ms)")
    right.set_title("P99 TTFT of the same runs (KVCompass: blue)")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(loc="outside lower center", ncol=4, fontsize=8)
    return fig


def run_run_length(
    out: Path, *, quick: bool, jobs: int = 1, runner: CellRunner = write_cell
) -> Artefact:
    grid = cells(quick)
    rate = grid[0].rate
    art = Artefact("run-length", COLUMNS, tabulate(collect(grid, out, jobs, runner)))
    art.meta = {
        "topology": SCALE.topology,
        "rate": rate,
        "load": SCALE.focus,
        "lengths": sorted({c.requests for c in grid if c.requests is not None}),
        "quick": quick,
        "paper_p99_ttft_over_kvcompass_3000rps": PAPER_RATIOS,
    }
    art.write(out, figure(art.rows, f", {load_label(SCALE.focus, rate)}"))
    return art
