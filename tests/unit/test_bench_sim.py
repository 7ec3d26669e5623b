"""bench/sim.py: its timed run reports every component it wraps, with the records of the
untimed run (wrapping must observe, not change)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench"))  # appended: its module names must not shadow others
bench_sim: Any = importlib.import_module("sim")


def test_the_timed_run_times_every_component_and_changes_nothing() -> None:
    """In its own process, over the interpreted modules; the same run as compiled here."""
    requests = bench_sim.workload("short", 200.0, 120, 0)
    plain = bench_sim.run("kvcompass", requests, 0, timed=False)
    timed = bench_sim.breakdown("short", 200.0, 120, 0, True)
    components = {
        "decide",
        "engine_submit",
        "engine_advance",
        "publisher_flush",
        "writer_stage",
        "writer_flush",
        "edge_receive",
        "total",
    }
    assert set(timed["us_per_request"]) == components
    assert all(v > 0 for v in timed["us_per_request"].values())
    for key in ("requests", "simulated_s", "index_keys_applied", "patch_batches"):
        assert timed[key] == plain[key]


def test_repeated_runs_report_the_median_run() -> None:
    requests = bench_sim.workload("short", 200.0, 60, 0)
    out = bench_sim.run("round-robin", requests, 0, timed=False, repeat=3)
    rates = out["runs_requests_per_s"]
    assert len(rates) == 3
    assert out["sim_requests_per_s"] == sorted(rates)[1]


def test_the_floor_writes_nothing() -> None:
    requests = bench_sim.workload("short", 200.0, 60, 0)
    floor = bench_sim.run("round-robin", requests, 0, timed=False, floor=True)
    assert floor["requests"] == 60
    assert floor["index_keys_applied"] == floor["patch_batches"] == 0
    assert bench_sim.run("round-robin", requests, 0, timed=False)["index_keys_applied"] > 0
