"""``kvcompass sim sweep``: a grid of policies × rates × seeds, in parallel processes.

Each cell writes its own folder (``<policy>/rate-<R>/seed-<N>``) and a cell whose folder
already holds a complete ``summary.json`` is skipped, so an interrupted sweep resumes
where it stopped. ``index.csv`` at the top lists every cell with its summary.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from kvcompass.loadgen.sim.run import RunOptions, run_cell

__all__ = ["cell_folder", "cells", "done_summary", "run_sweep"]


def cells(
    base: RunOptions, policies: Iterable[str], rates: Iterable[float], seeds: Iterable[int]
) -> list[RunOptions]:
    return [
        dataclasses.replace(base, policy=p, rate=r, seed=s)
        for p in policies
        for r in rates
        for s in seeds
    ]


def cell_folder(root: Path, cell: RunOptions) -> Path:
    return root / cell.policy / f"rate-{cell.rate:g}" / f"seed-{cell.seed}"


def done_summary(folder: Path) -> dict[str, Any] | None:
    """The cell's summary if its run completed (summary.json is written last)."""
    try:
        summary: dict[str, Any] = json.loads((folder / "summary.json").read_text())["summary"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return summary


def _run_and_write(cell: RunOptions, folder: Path) -> dict[str, Any]:
    result = run_cell(cell)
    result.write(folder)
    return result.summary()


def run_sweep(
    grid: list[RunOptions],
    root: Path,
    jobs: int | None = None,
    on_done: Callable[[RunOptions, bool], None] | None = None,
) -> Path:
    """Run every cell not done yet (``jobs`` processes; default the CPU count), then
    write ``index.csv``; ``on_done(cell, skipped)`` after each cell."""
    root.mkdir(parents=True, exist_ok=True)
    todo = []
    for cell in grid:
        if done_summary(cell_folder(root, cell)) is None:
            todo.append(cell)
        elif on_done is not None:
            on_done(cell, True)
    if todo:
        with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            futures = {
                pool.submit(_run_and_write, cell, cell_folder(root, cell)): cell for cell in todo
            }
            for future in as_completed(futures):
                future.result()  # a failed cell stops the sweep; finished cells stay done
                if on_done is not None:
                    on_done(futures[future], False)
    return _write_index(grid, root)


def _write_index(grid: list[RunOptions], root: Path) -> Path:
    rows = []
    for cell in grid:
        folder = cell_folder(root, cell)
        summary = done_summary(folder) or {}
        rows.append(
            {"policy": cell.policy, "rate": cell.rate, "seed": cell.seed}
            | {"folder": str(folder.relative_to(root))}
            | summary
        )
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    path = root / "index.csv"
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, list(names))
        writer.writeheader()
        writer.writerows(rows)
    return path
