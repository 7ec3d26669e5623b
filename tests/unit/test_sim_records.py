"""The simulator's summary and files, on hand-made records."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvcompass.loadgen.sim import LoadSample, SimRecord, SimResult


def record(i: int, worker: str, arrival: float, e2e_ms: float, prefill_ms: float) -> SimRecord:
    return SimRecord(
        f"r{i}", "s", "t", "a", "kvcompass", worker, "b" if worker == "b-0" else "a",
        arrival, 100, 10, 50, 40, 0, 0.0, 2.0, 0.0, prefill_ms, 0.0, 10.0, e2e_ms, "reuse-local",
    )  # fmt: skip


RESULT = SimResult(
    records=[
        record(0, "a-0", 0.0, 500.0, 30.0),
        record(1, "a-0", 1.0, 500.0, 30.0),
        record(2, "b-0", 2.0, 500.0, 20.0),  # finishes after the last arrival
    ],
    load_samples=[LoadSample(1.0, "a-0", 0.0, 1, 2.0)],
    config={"policy": "kvcompass"},
    wall_s=0.5,
    stats={"n_workers": 4},
)


def test_summary_counts_throughput_over_the_arrival_window() -> None:
    s = RESULT.summary()
    assert s["requests"] == 3
    assert s["throughput_req_per_s"] == pytest.approx(2 / 2.0)  # two finished by t = 2
    assert s["throughput_tokens_per_s"] == pytest.approx(2 * 110 / 2.0)
    assert s["reuse_share"] == pytest.approx(120 / 300)
    assert s["cross_region_share"] == pytest.approx(1 / 3)
    # Busy ms per worker: a-0 60, b-0 20, two idle: mean 20, peak 3.
    assert s["peak_load_factor"] == pytest.approx(3.0)


def test_write_lays_out_the_contract_files(tmp_path: Path) -> None:
    RESULT.write(tmp_path)
    with open(tmp_path / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"]
    assert float(rows[2]["e2e_ms"]) == 500.0
    with open(tmp_path / "load.csv") as f:
        assert next(csv.reader(f)) == ["t_s", "worker", "queue_ms", "running", "load_factor"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"] == {"policy": "kvcompass"}
    assert summary["summary"]["requests"] == 3
