"""One simulation cell: what ``sim run`` executes, every cell of ``sim sweep`` and every
run of the simulator-based reports (plain, picklable data, for worker processes)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcompass.loadgen.cli import check_bounded, workload
from kvcompass.loadgen.sim.config import SimConfig
from kvcompass.loadgen.sim.records import SimResult
from kvcompass.loadgen.sim.simulator import Progress, simulate
from kvcompass.loadgen.workloads import WORKLOADS, LiveRequest
from kvcompass.routing import Ablations, RoutingConfig, routing_config
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology
from kvcompass.worker import EvictionPolicy

__all__ = ["ABLATIONS", "Cell", "recorded_config", "run_cell", "topology_of", "write_cell"]

#: A cell's folder name at most (ASCII; file systems allow 255 bytes per name).
MAX_KEY_CHARS = 240
#: Ablation names: each switches one term of the joint score off (Fig. 15).
ABLATIONS = tuple(f.name for f in dataclasses.fields(Ablations))


@dataclass(frozen=True)
class Cell:
    """The policy at a Poisson rate for a seed, the simulator's knobs and the workload's
    (the names of ``kvcompass loadgen``). With ``trace_times`` a Mooncake trace arrives
    at its own timestamps divided by ``speed`` instead (``rate`` is then unused).

    Arrivals stop at ``duration`` simulated seconds or after ``requests`` of them,
    whichever comes first (None: no such bound). ``resync`` is on by default, as in the
    live edges and :class:`SimConfig`; the paper's edges have none, so the reports turn
    it off (``reports.cells.paper_cell``)."""

    policy: str = "kvcompass"
    rate: float = 100.0
    seed: int = 0
    topology: str = "sim-8region"
    workload: str = "synthetic"
    trace: Path | None = None
    azure: Path | None = None
    azure_lengths: bool = False
    duration: float | None = 30.0
    requests: int | None = None
    ablations: tuple[str, ...] = ()
    update_delay_ms: float = 0.0
    update_loss: float = 0.0
    jitter_pct: float = 0.0
    flush_ms: float = 5.0
    resync: bool = True
    serving_overhead_ms: float = 0.0
    eviction: str = "lru"
    sample_every_s: float = 1.0
    region_weights: tuple[float, ...] = ()
    params: tuple[str, ...] = ()
    speed: float = 1.0
    trace_times: bool = False
    skip: int = 0
    tenants: str = "default"
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None
    #: KVCompass's remote margin (``RoutingConfig.remote_margin_rtt``; 0: the paper's score).
    remote_margin_rtt: float = RoutingConfig.remote_margin_rtt
    #: KVCompass credits prefixes it has just sent (``RoutingConfig.pending_credit``).
    pending_credit: bool = RoutingConfig.pending_credit
    #: KVCompass counts a hit only where it extends the worker's shorter ones
    #: (``RoutingConfig.prefix_chain``).
    prefix_chain: bool = RoutingConfig.prefix_chain
    #: KVCompass's capacity price λ = min(λmax, min queue / τ) (``RoutingConfig.tau_ms``,
    #: ``lambda_max``; the paper's: ``routing.PAPER_PRICE``).
    tau_ms: float = RoutingConfig.tau_ms
    lambda_max: float = RoutingConfig.lambda_max

    def __post_init__(self) -> None:
        # Checked when the cell is made, so a sweep refuses a bad rate before running any
        # cell, and a run with no arrivals does not print an empty summary.
        if not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if not math.isfinite(self.rate):  # every arrival would come at t = 0
            raise ValueError(f"rate must be finite, got {self.rate}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        names = (("workload", WORKLOADS), ("eviction", tuple(str(e) for e in EvictionPolicy)))
        for name, known in names:  # a grid file's typo, before any cell runs
            if getattr(self, name) not in known:
                value = getattr(self, name)
                raise ValueError(f"unknown {name} {value!r}; known: {', '.join(known)}")
        unknown = set(self.ablations) - set(ABLATIONS)
        if unknown:
            raise ValueError(f"unknown ablation(s) {sorted(unknown)}; known: {list(ABLATIONS)}")
        if self.trace_times and self.workload != "trace":
            raise ValueError(f"trace_times replays a trace's arrivals, not {self.workload}'s")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be positive (or unbounded), got {self.duration}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be at least 1 (or unbounded), got {self.requests}")
        check_bounded(self.workload, self.azure, self.duration, self.requests)
        if not self.tau_ms > 0 or not self.lambda_max >= 0:
            raise ValueError(
                f"the capacity price needs tau_ms > 0 and lambda_max >= 0, got "
                f"{self.tau_ms} and {self.lambda_max}"
            )

    @property
    def key(self) -> str:
        """The cell's folder name: workload, policy (+ ablations), rate, then every field
        that differs from the defaults, so two different cells never share a folder."""
        arrivals = "trace-times" if self.trace_times else f"r{self.rate:g}"
        parts = [self.workload, "+no-".join((self.policy, *self.ablations)), arrivals]
        defaults = Cell()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in _IN_HEAD and value != getattr(defaults, f.name):
                shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
                parts.append(f"{f.name}={shown}")
        key = re.sub(r"[^A-Za-z0-9_.,+=-]", "_", "__".join(parts))
        if len(key) <= MAX_KEY_CHARS:
            return key
        # A folder name must fit the file system's 255 bytes: eight region weights at
        # full float digits overran it and the sweep died on "File name too long". The
        # head keeps the name readable; a digest of the whole key keeps it unique.
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return f"{key[: MAX_KEY_CHARS - len(digest) - 2]}__{digest}"

    def sim_config(self, topology: Topology) -> SimConfig:
        ablations = Ablations(**dict.fromkeys(self.ablations, False))
        return SimConfig(
            topology,
            routing=routing_config(self, ablations=ablations),
            eviction=EvictionPolicy(self.eviction),
            time_limit_s=self.duration,
            **{name: getattr(self, name) for name in _PASSED_ON},
        )

    def requests_of(self, topology: Topology) -> Iterator[LiveRequest]:
        # The load generator's own reading of these options: both replay the same requests.
        args = argparse.Namespace(**dataclasses.asdict(self))
        args.params = list(self.params)
        if self.trace_times or self.azure is not None:
            args.rate = None  # make_workload: the trace's own timestamps
        return workload(args, topology)


_IN_HEAD = ("workload", "policy", "ablations", "rate", "trace_times")
#: The cell's fields SimConfig has under the same name and type: handed on as they are.
_PASSED_ON = tuple(
    f.name
    for f in dataclasses.fields(SimConfig)
    if f.name in {c.name for c in dataclasses.fields(Cell)}
    and f.name not in ("topology", "eviction")
)


def topology_of(name_or_path: str) -> Topology:
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


def run_cell(cell: Cell, progress: Progress | None = None) -> SimResult:
    """Simulate the cell; ValueError if no request arrived (its summary would be a row of
    zeros that reads as a 0-ms TTFT: a window shorter than the first arrival, say, or a
    trace skipped past its end)."""
    topology = topology_of(cell.topology)
    result = simulate(cell.sim_config(topology), cell.requests_of(topology), progress)
    if not result.records:
        raise ValueError(f"no request arrived in {_arrivals(cell)}, so there is nothing to report")
    result.config["cell"] = _fields(cell)
    return result


def _arrivals(cell: Cell) -> str:
    """The cell's arrivals, as its options describe them."""
    source = (
        f"the trace {cell.trace}" if cell.workload == "trace" else f"the {cell.workload} workload"
    )
    bounds = ["at its own times" if cell.trace_times else f"at {cell.rate:g} req/s"]
    if cell.duration is not None:
        bounds.append(f"for {cell.duration:g} s")
    if cell.skip:
        bounds.append(f"after skipping {cell.skip} records")
    return f"{source} ({', '.join(bounds)})"


def recorded_config(cell: Cell) -> dict[str, Any]:
    """The ``config`` a finished run of ``cell`` records in its ``summary.json``, as JSON
    reads it back: every simulation setting, defaults included, and the cell's fields.
    A folder whose record differs was made under other defaults or code."""
    config = cell.sim_config(topology_of(cell.topology)).as_dict() | {"cell": _fields(cell)}
    loaded: dict[str, Any] = json.loads(json.dumps(config, default=str))
    return loaded


def _fields(cell: Cell) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cell).items()}


def write_cell(cell: Cell, folder: Path) -> None:
    """Run the cell and write its folder (``summary.json`` last): a grid's runner."""
    run_cell(cell).write(folder)
