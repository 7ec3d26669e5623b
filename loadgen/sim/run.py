"""One simulation cell from command-line style options: what ``sim run`` and every cell
of ``sim sweep`` execute (a plain function of picklable options, for worker processes)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvcompass.loadgen.cli import workload
from kvcompass.loadgen.sim.config import SimConfig
from kvcompass.loadgen.sim.records import SimResult
from kvcompass.loadgen.sim.simulator import Progress, simulate
from kvcompass.loadgen.workloads import LiveRequest
from kvcompass.routing import Ablations, RoutingConfig
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology
from kvcompass.worker import EvictionPolicy

__all__ = ["ABLATIONS", "RunOptions", "run_cell", "topology_of"]

#: ``--ablation`` names: each switches one term of the joint score off (Fig. 15).
ABLATIONS = tuple(f.name for f in dataclasses.fields(Ablations))


@dataclass(frozen=True)
class RunOptions:
    """A cell: the sim's knobs and the workload's (the names of ``kvcompass loadgen``)."""

    topology: str = "sim-8region"
    policy: str = "kvcompass"
    workload: str = "synthetic"
    trace: Path | None = None
    azure: Path | None = None
    azure_lengths: bool = False
    rate: float = 100.0
    duration: float = 30.0
    requests: int | None = None
    seed: int = 0
    ablations: tuple[str, ...] = ()
    update_delay_ms: float = 0.0
    update_loss: float = 0.0
    jitter_pct: float = 0.0
    flush_ms: float = 5.0
    resync: bool = True
    eviction: str = "lru"
    sample_every_s: float = 1.0
    region_weights: tuple[float, ...] = ()
    params: tuple[str, ...] = field(default_factory=tuple)
    speed: float = 1.0
    skip: int = 0
    tenants: str = "default"
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None

    def sim_config(self, topology: Topology) -> SimConfig:
        unknown = set(self.ablations) - set(ABLATIONS)
        if unknown:
            raise ValueError(f"unknown ablation(s) {sorted(unknown)}; known: {list(ABLATIONS)}")
        ablations = Ablations(**dict.fromkeys(self.ablations, False))
        return SimConfig(
            topology,
            policy=self.policy,
            routing=RoutingConfig(ablations=ablations),
            seed=self.seed,
            eviction=EvictionPolicy(self.eviction),
            update_delay_ms=self.update_delay_ms,
            update_loss=self.update_loss,
            resync=self.resync,
            jitter_pct=self.jitter_pct,
            flush_ms=self.flush_ms,
            sample_every_s=self.sample_every_s,
            time_limit_s=self.duration,
        )

    def requests_of(self, topology: Topology) -> Iterator[LiveRequest]:
        # The load generator's own reading of these options: both replay the same requests.
        args = argparse.Namespace(**dataclasses.asdict(self))
        args.params = list(self.params)
        return workload(args, topology)


def topology_of(name_or_path: str) -> Topology:
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


def run_cell(options: RunOptions, progress: Progress | None = None) -> SimResult:
    topology = topology_of(options.topology)
    config = options.sim_config(topology)
    result = simulate(config, options.requests_of(topology), progress)
    result.config["workload"] = {
        k: str(v) if isinstance(v, Path) else v
        for k, v in dataclasses.asdict(options).items()
        if k not in ("topology", "policy", "seed")
    }
    return result
