"""What a simulation run produces: per-request records, per-worker load samples, a summary.

The reports read these names; :meth:`SimResult.write` lays them out as ``requests.csv``,
``load.csv`` and ``summary.json`` (written last: a folder with it is complete).

Load factor (Fig. 14): a worker's busy prefill time (reload + prefill of the requests
whose prefill *ended* in the window, so a long prefill counts in the window it finishes)
over the last ``sample_every_s``, divided by the pool's mean over the same window; 1.0
for every worker of an idle window. The summary's ``peak_load_factor`` is the same
ratio over the whole run (the busiest worker's total over the pool mean), which is what
a scheme's single peak number means; the windows show how it moves.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvcompass.frozen_init import frozen_init
from kvcompass.loadgen.sim.fingerprint import code_fingerprint

__all__ = ["LoadSample", "SimRecord", "SimResult"]


@frozen_init
@dataclass(frozen=True, slots=True)
class SimRecord:
    """One request, times in ms. ``matched_tokens``: what the policy claimed at the worker;
    ``reused_tokens``: what the worker's cache actually held at prefill start (VRAM and
    DRAM), of which ``dram_tokens`` came from DRAM. Recomputed = prompt − reused.
    ``wan_ms``: the round trip paid (out and back); ``ttft_ms`` = lookup + WAN out +
    serving overhead + queue + reload + prefill + WAN back; ``e2e_ms`` up to the last
    token back at the edge. ``overhead_ms``: ``SimConfig.serving_overhead_ms``.
    ``expected_queue_ms``: the queue the policy's score expected at the chosen worker
    when it decided (its estimate; NaN for a decision without candidates), to set
    beside ``queue_ms``, the queue the request met."""

    request_id: str
    session: str
    tenant: str
    origin: str
    policy: str
    worker: str
    worker_region: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    matched_tokens: int
    reused_tokens: int
    dram_tokens: int
    lookup_ms: float
    wan_ms: float
    queue_ms: float
    prefill_ms: float
    reload_ms: float
    ttft_ms: float
    e2e_ms: float
    reason: str
    overhead_ms: float = 0.0
    expected_queue_ms: float = float("nan")

    @property
    def recomputed_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens


@frozen_init
@dataclass(frozen=True, slots=True)
class LoadSample:
    """One worker in one sample window: its queue and completions at ``t_s``, and its
    compute (reload + prefill ms of the requests whose prefill ended in the window) over
    the pool's mean; NaN when the pool computed nothing in the window."""

    t_s: float
    worker: str
    queue_ms: float
    running: int
    load_factor: float


@dataclass
class SimResult:
    """``records`` in completion order; ``stats``: counters of the index pipeline."""

    records: list[SimRecord]
    load_samples: list[LoadSample]
    config: dict[str, Any]
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        recs = self.records
        out: dict[str, Any] = {"requests": len(recs), "wall_s": self.wall_s}
        if not recs:
            return out | self.stats
        ttft = np.array([r.ttft_ms for r in recs])
        e2e = np.array([r.e2e_ms for r in recs])
        # Throughput over the arrival window: what finished while requests kept coming,
        # so the drain after the last arrival neither dilutes nor inflates it.
        start = min(r.arrival_s for r in recs)
        end = max(r.arrival_s for r in recs)
        span = max(end - start, 1e-9)
        done = [r for r in recs if r.arrival_s + r.e2e_ms / 1e3 <= end]
        prompt = sum(r.prompt_tokens for r in recs)
        served = sum(r.prompt_tokens + r.output_tokens for r in done)
        busy: dict[str, float] = {}
        for r in recs:
            busy[r.worker] = busy.get(r.worker, 0.0) + r.reload_ms + r.prefill_ms
        # Workers that served nothing count in the mean (their share is 0).
        mean = sum(busy.values()) / max(int(self.stats.get("n_workers", 0)), len(busy))
        peak = max(busy.values()) / mean if mean > 0 else 1.0
        out |= {
            "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "e2e_p50_ms": float(np.percentile(e2e, 50)),
            "e2e_p99_ms": float(np.percentile(e2e, 99)),
            "queue_mean_ms": float(np.mean([r.queue_ms for r in recs])),
            "throughput_req_per_s": len(done) / span,
            # Prompt plus generated tokens of those requests per simulated second.
            "throughput_tokens_per_s": served / span,
            "reuse_share": sum(r.reused_tokens for r in recs) / max(prompt, 1),
            "cross_region_share": sum(r.worker_region != r.origin for r in recs) / len(recs),
            "peak_load_factor": peak,
            # How far the queue a request met exceeded what the score expected, for
            # requests served in their own region and for those sent to another.
            "queue_underestimate_local_ms": _underestimate(recs, remote=False),
            "queue_underestimate_remote_ms": _underestimate(recs, remote=True),
            "sim_requests_per_wall_s": len(recs) / max(self.wall_s, 1e-9),
        }
        return out | self.stats

    def write(self, folder: str | Path) -> Path:
        """``requests.csv``, ``load.csv``, then ``summary.json`` (with the config and the
        code's fingerprint)."""
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        _write_csv(path / "requests.csv", SimRecord, self.records)
        _write_csv(path / "load.csv", LoadSample, self.load_samples)
        summary = {"summary": self.summary(), "config": self.config, "code": code_fingerprint()}
        (path / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return path


def _underestimate(recs: Sequence[SimRecord], remote: bool) -> float:
    """Mean of met − expected queue (ms) over the requests with an estimate; NaN if none."""
    gaps = [
        r.queue_ms - r.expected_queue_ms
        for r in recs
        if (r.worker_region != r.origin) == remote and r.expected_queue_ms == r.expected_queue_ms
    ]
    return float(np.mean(gaps)) if gaps else float("nan")


def _write_csv(path: Path, kind: type, rows: Sequence[Any]) -> None:
    names = [f.name for f in dataclasses.fields(kind)]
    # Every field is a scalar: attrgetter reads them as astuple would, without its
    # per-row fields() and deep copies (a tenth of a 6,000-request cell's time).
    row = operator.attrgetter(*names)
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(names)
        writer.writerows(map(row, rows))
