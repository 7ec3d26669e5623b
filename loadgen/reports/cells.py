"""The reports' cells: the paper's settings, and arrival rates scaled by pool capacity."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

from kvcompass.loadgen.sim.cell import Cell
from kvcompass.routing import PAPER_PRICE

__all__ = ["PAPER_ROUTING", "WORKLOADS", "no_reuse_capacity", "paper_cell", "rates_of"]

#: The paper's Fig. 12 / Fig. 16 workloads (§5.1), one row of panels each.
WORKLOADS = ("mixed", "wildchat", "lmsys")
#: The cell settings of the paper's KVCompass: each switches off one thing the router
#: ships beyond the paper (``RoutingConfig``'s defaults).
PAPER_ROUTING: dict[str, Any] = {
    "remote_margin_rtt": 0.0,
    "pending_credit": False,
    "prefix_chain": False,
    **PAPER_PRICE,
}


def paper_cell(policy: str, rate: float, seed: int = 0, **knobs: Any) -> Cell:
    """A report's cell: the paper's Mixed workload (look-alike), a request count rather
    than a time limit (``requests``, 2000 unless given), the paper's edges, which apply
    whatever patches reach them (no resync; Table 4 turns it on for its own rows), and
    the paper's KVCompass (``PAPER_ROUTING``: no remote margin, pending credit or prefix
    chain, the paper's capacity price; the margin and shipped-grid reports set theirs).
    """
    paper: dict[str, Any] = {
        "workload": "mixed",
        "duration": None,
        "requests": 2000,
        "resync": False,
        **PAPER_ROUTING,
    }
    return Cell(policy, rate, seed, **(paper | knobs))


@functools.cache
def no_reuse_capacity(topology_name: str, workload: str = "mixed", sample: int = 2000) -> float:
    """λ0 (req/s): the rate at which the pool is fully busy prefilling every prompt in
    full (paper §3.5), from the workload's mean prompt and each worker's β."""
    from kvcompass.loadgen.workloads import make_workload
    from kvcompass.topology import load_builtin

    topology = load_builtin(topology_name)
    requests = make_workload(workload, topology, 1.0, 0)
    prompts = [len(r.tokens) for r in itertools.islice(requests, sample)]
    mean_prompt = sum(prompts) / len(prompts)
    return sum(1e3 / (w.beta_ms_per_token * mean_prompt) for w in topology.workers)


def rates_of(
    topology_name: str, fractions: Sequence[float], workload: str = "mixed"
) -> tuple[float, ...]:
    """Arrival rates (req/s, one decimal) at these multiples of λ0: the paper's absolute
    rates assume its workload's prompt lengths, ours differ, so grids scale by capacity."""
    lam0 = no_reuse_capacity(topology_name, workload)
    return tuple(round(f * lam0, 1) for f in fractions)
