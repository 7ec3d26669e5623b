"""Each simulator-based report, fed hand-made run folders, writes a PNG and its CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.fig9 import run_fig9
from kvcompass.loadgen.reports.fig12 import run_fig12
from kvcompass.loadgen.reports.fig13 import run_fig13
from kvcompass.loadgen.reports.fig14 import peak_load_factor, run_fig14
from kvcompass.loadgen.reports.fig15 import run_fig15
from kvcompass.loadgen.reports.grid import Cell
from kvcompass.loadgen.reports.runs import load_run
from kvcompass.loadgen.reports.table4 import run_table4

REQUEST_FIELDS = [
    "request_id",
    "session",
    "tenant",
    "origin",
    "policy",
    "worker",
    "worker_region",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "matched_tokens",
    "reused_tokens",
    "dram_tokens",
    "lookup_ms",
    "wan_ms",
    "queue_ms",
    "prefill_ms",
    "reload_ms",
    "ttft_ms",
    "e2e_ms",
    "reason",
]
LOAD_FIELDS = ("t_s", "worker", "queue_ms", "running", "load_factor")


def fake_run(cell: Cell, folder: Path) -> None:
    """A small, deterministic run folder in the simulator's layout (records.py)."""
    rng = np.random.default_rng(abs(hash(cell.key)) % 2**32)
    folder.mkdir(parents=True, exist_ok=True)
    workers = [f"w{i}" for i in range(4)]
    with (folder / "requests.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_FIELDS)
        for i in range(40):
            prompt = int(rng.integers(100, 4000))
            reused = int(rng.integers(0, prompt))
            matched = reused + int(rng.integers(0, 2)) * 64
            ttft = float(rng.exponential(100))
            w.writerow(
                [
                    f"r{i}",
                    "s",
                    "t",
                    "a",
                    cell.policy,
                    workers[i % 4],
                    "a",
                    i / cell.rate,
                    prompt,
                    20,
                    matched,
                    reused,
                    0,
                    0.0,
                    10.0,
                    float(rng.exponential(5)),
                    float(rng.exponential(30)),
                    0.0,
                    ttft,
                    ttft + 200,
                    "score",
                ]
            )
    with (folder / "load.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(LOAD_FIELDS)
        for t in range(5):
            for k, worker in enumerate(workers):
                w.writerow([float(t), worker, 1.0, 1, 0.5 + 0.5 * k])
    summary = {
        "ttft_p99_ms": float(rng.uniform(100, 1000)),
        "ttft_p50_ms": 50.0,
        "e2e_p99_ms": 900.0,
        "throughput_req_per_s": cell.rate,
        "throughput_tokens_per_s": float(rng.uniform(1e5, 2e5)),
        "reuse_share": 0.3,
        "cross_region_share": 0.1,
    }
    (folder / "summary.json").write_text(json.dumps({"summary": summary, "config": {}}))


Report = Callable[..., Artefact]


@pytest.mark.parametrize(
    ("report", "name"),
    [
        (run_fig9, "fig9"),
        (run_fig12, "fig12"),
        (run_fig13, "fig13"),
        (run_fig14, "fig14"),
        (run_fig15, "fig15"),
        (run_table4, "table4"),
    ],
)
def test_report_writes_png_and_csv_with_its_columns(
    report: Report, name: str, tmp_path: Path
) -> None:
    art = report(tmp_path, quick=True, runner=fake_run)
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    with (tmp_path / f"{name}.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows
    assert list(rows[0]) == list(art.columns)
    assert json.loads((tmp_path / f"{name}.json").read_text())["artefact"] == name


def test_fig16_uses_the_16_region_topology(tmp_path: Path) -> None:
    art = run_fig12(tmp_path, quick=True, scale="fig16", runner=fake_run)
    assert art.meta["topology"] == "sim-16region"
    assert (tmp_path / "fig16.png").stat().st_size > 1000


def test_peak_is_the_hottest_workers_time_average(tmp_path: Path) -> None:
    fake_run(Cell("random", 10), tmp_path)
    peak, worker = peak_load_factor(load_run(tmp_path))
    assert (peak, worker) == (2.0, "w3")
