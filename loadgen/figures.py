"""PNG figures of live runs (matplotlib, headless): what the demo shows at a glance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt
import numpy as np

from kvcompass.loadgen.records import RequestRecord
from kvcompass.loadgen.summary import RunSummary

__all__ = ["ttft_figure"]


def ttft_figure(
    records: Mapping[str, Sequence[RequestRecord]], summaries: Sequence[RunSummary], path: Path
) -> Path:
    """Left: the TTFT distribution of each run (CDF, log time). Right: prefill tokens
    each run reused vs recomputed. One line / bar pair per run, in the given order."""
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for name, rows in records.items():
        ttft = np.sort([r.ttft_ms for r in rows if r.ok and r.ttft_ms is not None])
        if ttft.size:
            cdf.step(ttft, np.arange(1, ttft.size + 1) / ttft.size, where="post", label=name)
    cdf.set_xscale("log")
    cdf.set_xlabel("time to first token (ms, log scale)")
    cdf.set_ylabel("share of requests")
    cdf.set_title("TTFT, every region")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(loc="lower right")

    names = [s.name for s in summaries]
    totals = [s.region("all") for s in summaries]
    x = np.arange(len(names))
    reused = np.array([t.reused_tokens for t in totals]) / 1e3
    recomputed = np.array([t.recomputed_tokens for t in totals]) / 1e3
    bars.bar(x, reused, label="reused", color="tab:green")
    bars.bar(x, recomputed, bottom=reused, label="recomputed", color="tab:gray")
    bars.set_xticks(x, names)
    bars.set_ylabel("prefill tokens (thousands)")
    bars.set_title("prompt tokens reused vs recomputed")
    bars.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
