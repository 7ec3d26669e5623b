"""``kvcompass sim sweep``: one folder per cell, an index, and resuming skips done cells."""

from __future__ import annotations

import csv
from pathlib import Path

from kvcompass.loadgen.sim.cell import Cell, topology_of
from kvcompass.loadgen.sim.grid import product, run_grid
from kvcompass.services.maintenance.settings import MaintenanceSettings

BASE = Cell(topology="testbed-3region", rate=4.0, duration=1.5, params=("answer_tokens_max=16",))


def test_sweep_writes_every_cell_then_resumes_without_rerunning(tmp_path: Path) -> None:
    grid = product(BASE, ["kvcompass", "round-robin"], [4.0], [0, 1])
    seen: list[bool] = []
    folders = run_grid(grid, tmp_path, jobs=2, on_done=lambda _c, skipped: seen.append(skipped))

    assert seen == [False] * 4
    with open(tmp_path / "index.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["policy"], r["seed"]) for r in rows} == {
        (p, s) for p in ("kvcompass", "round-robin") for s in ("0", "1")
    }
    assert all(int(r["requests"]) > 0 for r in rows)
    assert {r["folder"] for r in rows} == {f.name for f in folders.values()}
    stamps = {c: (folders[c] / "summary.json").stat().st_mtime_ns for c in grid}

    # A cell whose summary is missing (an interrupted run) is the only one run again.
    (folders[grid[0]] / "summary.json").unlink()
    seen.clear()
    run_grid(grid, tmp_path, jobs=1, on_done=lambda _c, skipped: seen.append(skipped))
    assert sorted(seen) == [False, True, True, True]
    for cell in grid[1:]:
        assert (folders[cell] / "summary.json").stat().st_mtime_ns == stamps[cell]
    assert (folders[grid[0]] / "summary.json").exists()


def test_a_cell_sets_the_flush_period_and_defaults_to_the_live_one() -> None:
    topology = topology_of(BASE.topology)
    assert BASE.sim_config(topology).flush_ms == MaintenanceSettings().flush_ms
    longer = Cell(topology=BASE.topology, flush_ms=20.0)
    assert longer.sim_config(topology).flush_ms == 20.0
