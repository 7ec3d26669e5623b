"""A grid of simulation cells (policies × rates × seeds × knobs), run in parallel processes.

Each cell writes its own folder under the grid's output folder; a folder whose
``summary.json`` is complete is skipped, so an interrupted grid resumes where it stopped
(the simulator writes summary.json last). Cells are plain data so they pickle to workers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from kvcompass.loadgen.reports.runs import is_complete

__all__ = ["ABLATIONS", "Cell", "CellRunner", "run_grid", "simulate_cell"]

#: Fig. 15's ablations: name → the :class:`kvcompass.routing.Ablations` switch it turns off.
ABLATIONS = {
    "no-load-aware": "load_aware",
    "no-xregion-reuse": "xregion_reuse",
    "tier-blind": "tier_aware",
    "no-kv-migration": "migration",
}


@dataclass(frozen=True)
class Cell:
    """One simulation: the policy at a Poisson rate on a topology, for ``requests``
    arrivals of the synthetic mixed workload, plus the index-pipeline knobs of Table 4."""

    policy: str
    rate: float
    seed: int = 0
    topology: str = "sim-8region"
    requests: int = 2000
    ablation: str = ""
    jitter_pct: float = 0.0
    update_loss: float = 0.0
    update_delay_ms: float = 0.0
    resync: bool = False
    tag: str = ""

    @property
    def key(self) -> str:
        """The cell's folder name: every field that differs from the defaults."""
        parts = [self.policy + (f"+{self.ablation}" if self.ablation else ""), f"r{self.rate:g}"]
        defaults = Cell(self.policy, self.rate)
        for f in dataclasses.fields(self):
            if f.name in ("policy", "rate", "ablation"):
                continue
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name):
                parts.append(f"{f.name}={value}")
        return re.sub(r"[^A-Za-z0-9_.+=-]", "_", "__".join(parts))


CellRunner = Callable[[Cell, Path], None]


def simulate_cell(cell: Cell, folder: Path) -> None:
    """Run one cell with the event-driven simulator and write its folder."""
    from kvcompass.loadgen.sim import SimConfig, simulate
    from kvcompass.loadgen.workloads import (
        RegionShares,
        SyntheticConfig,
        SyntheticWorkload,
        bounded,
    )
    from kvcompass.routing import Ablations, RoutingConfig
    from kvcompass.topology import load_builtin

    topology = load_builtin(cell.topology)
    ablations = Ablations()
    if cell.ablation:
        ablations = dataclasses.replace(ablations, **{ABLATIONS[cell.ablation]: False})
    config = SimConfig(
        topology=topology,
        policy=cell.policy,
        routing=RoutingConfig(ablations=ablations),
        seed=cell.seed,
        update_delay_ms=cell.update_delay_ms,
        update_loss=cell.update_loss,
        resync=cell.resync,
        jitter_pct=cell.jitter_pct,
    )
    workload = SyntheticWorkload(
        SyntheticConfig(seed=cell.seed, rate=cell.rate), RegionShares.of(topology)
    )
    result = simulate(config, bounded(workload.requests(), count=cell.requests))
    result.config["cell"] = dataclasses.asdict(cell)
    result.write(folder)


def run_grid(
    cells: Sequence[Cell],
    out: Path,
    *,
    jobs: int = 1,
    runner: CellRunner = simulate_cell,
    progress: bool = True,
) -> dict[Cell, Path]:
    """Run every cell whose folder is not complete; return each cell's folder."""
    folders = {cell: out / cell.key for cell in cells}
    todo = [c for c in dict.fromkeys(cells) if not is_complete(folders[c])]
    bar = tqdm(total=len(todo), desc=f"grid {out.name}", unit="run", disable=not progress)
    try:
        if jobs <= 1:
            for cell in todo:
                runner(cell, folders[cell])
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(runner, c, folders[c]) for c in todo]
                for future in as_completed(futures):
                    future.result()
                    bar.update()
    finally:
        bar.close()
    return folders
