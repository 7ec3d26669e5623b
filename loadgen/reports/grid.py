"""A grid of simulation cells (policies × rates × seeds × knobs), run in parallel processes.

Each cell writes its own folder under the grid's output folder; a folder whose
``summary.json`` is complete is skipped, so an interrupted grid resumes where it stopped
(the simulator writes summary.json last). Cells are plain data so they pickle to workers.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

if TYPE_CHECKING:
    from kvcompass.loadgen.workloads import LiveRequest

from kvcompass.loadgen.reports.runs import is_complete

__all__ = [
    "ABLATIONS",
    "Cell",
    "CellRunner",
    "no_reuse_capacity",
    "rates_of",
    "run_grid",
    "simulate_cell",
]

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
    arrivals of a workload (``make_workload``'s names; the paper's Mixed by default), plus
    the index-pipeline knobs of Table 4."""

    policy: str
    rate: float
    seed: int = 0
    topology: str = "sim-8region"
    workload: str = "mixed"
    requests: int = 2000
    ablation: str = ""
    jitter_pct: float = 0.0
    update_loss: float = 0.0
    update_delay_ms: float = 0.0
    resync: bool = False
    tag: str = ""

    @property
    def key(self) -> str:
        """The cell's folder name: the workload, then every field that differs from the
        defaults (a folder never stands for another workload's run)."""
        parts = [
            self.workload,
            self.policy + (f"+{self.ablation}" if self.ablation else ""),
            f"r{self.rate:g}",
        ]
        defaults = Cell(self.policy, self.rate)
        for f in dataclasses.fields(self):
            if f.name in ("workload", "policy", "rate", "ablation"):
                continue
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name):
                parts.append(f"{f.name}={value}")
        return re.sub(r"[^A-Za-z0-9_.+=-]", "_", "__".join(parts))


CellRunner = Callable[[Cell, Path], None]


def _workload(topology_name: str, workload: str, seed: int, rate: float) -> Iterator[LiveRequest]:
    """The requests a cell replays, over the topology's regions weighted by worker count."""
    from kvcompass.loadgen.workloads import make_workload
    from kvcompass.topology import load_builtin

    return make_workload(workload, load_builtin(topology_name), rate, seed)


@functools.cache
def no_reuse_capacity(topology_name: str, workload: str = "mixed", sample: int = 2000) -> float:
    """λ0 (req/s): the rate at which the pool is fully busy prefilling every prompt in
    full (paper §3.5), from the workload's mean prompt and each worker's β."""
    from kvcompass.topology import load_builtin

    prompts = [
        len(r.tokens) for r in itertools.islice(_workload(topology_name, workload, 0, 1.0), sample)
    ]
    mean_prompt = sum(prompts) / len(prompts)
    workers = load_builtin(topology_name).workers
    return sum(1e3 / (w.beta_ms_per_token * mean_prompt) for w in workers)


def rates_of(
    topology_name: str, fractions: Sequence[float], workload: str = "mixed"
) -> tuple[float, ...]:
    """Arrival rates (req/s, one decimal) at these multiples of λ0: the paper's absolute
    rates assume its workload's prompt lengths, ours differ, so grids scale by capacity."""
    lam0 = no_reuse_capacity(topology_name, workload)
    return tuple(round(f * lam0, 1) for f in fractions)


def simulate_cell(cell: Cell, folder: Path) -> None:
    """Run one cell with the event-driven simulator and write its folder."""
    from kvcompass.loadgen.sim import SimConfig, simulate
    from kvcompass.loadgen.workloads import bounded
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
    workload = _workload(cell.topology, cell.workload, cell.seed, cell.rate)
    result = simulate(config, bounded(workload, count=cell.requests))
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
    bar = tqdm(total=len(todo), desc="simulations", unit="run", disable=not progress)
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
