"""One entry point for every workload, shared by ``kvcompass loadgen`` and the simulator:
``make_workload(name, topology, rate, seed, **params)``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kvcompass.loadgen.workloads.chat import ChatWorkload, LMSYSConfig, WildChatConfig
from kvcompass.loadgen.workloads.mixed import MixedConfig, MixedWorkload
from kvcompass.loadgen.workloads.mooncake import TraceConfig, TraceWorkload, read_trace
from kvcompass.loadgen.workloads.params import Params
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest
from kvcompass.loadgen.workloads.synthetic import SyntheticConfig, SyntheticWorkload
from kvcompass.topology import Topology

__all__ = ["WORKLOADS", "make_workload", "workload_config"]

WORKLOADS = ("mixed", "wildchat", "lmsys", "synthetic", "trace")

_CONFIGS: dict[str, type[Params]] = {
    "mixed": MixedConfig,
    "wildchat": WildChatConfig,
    "lmsys": LMSYSConfig,
    "synthetic": SyntheticConfig,
}


def workload_config(name: str) -> type[Params]:
    """The parameter dataclass of a generated workload (not ``trace``)."""
    if name not in _CONFIGS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return _CONFIGS[name]


def make_workload(
    name: str,
    topology: Topology,
    rate: float | None = None,
    seed: int = 0,
    *,
    region_weights: Sequence[float] = (),
    **params: Any,
) -> Iterator[LiveRequest]:
    """The requests of workload ``name`` in arrival order, deterministic for ``seed``.

    ``rate``: Poisson arrivals per second (None: the generator's default, or for
    ``trace`` the trace's own timestamps). ``region_weights``: population share per
    region in topology order (empty: worker counts). ``params``: the generator's
    parameters by name, as values or as text (``--set``); for ``trace``, ``trace=PATH``,
    ``limit=N`` records read, and the fields of :class:`TraceConfig`.
    Generated workloads are endless under Poisson arrivals: bound them
    (:func:`~kvcompass.loadgen.workloads.bounded`).
    """
    shares = RegionShares.of(topology, region_weights)
    if name == "trace":
        return _trace(shares, rate, seed, tuple(region_weights), params)
    values: dict[str, Any] = {"seed": seed, **params}
    if rate is not None:
        values["rate"] = rate
    config = workload_config(name)().with_values(values)
    if isinstance(config, MixedConfig):
        return MixedWorkload(config, shares).requests()
    if isinstance(config, WildChatConfig | LMSYSConfig):
        prefix = "w" if isinstance(config, WildChatConfig) else "l"
        return ChatWorkload(config, shares, id_prefix=prefix).requests()
    assert isinstance(config, SyntheticConfig)
    return SyntheticWorkload(config, shares).requests()


def _trace(
    shares: RegionShares,
    rate: float | None,
    seed: int,
    weights: tuple[float, ...],
    params: dict[str, Any],
) -> Iterator[LiveRequest]:
    params = dict(params)
    path = params.pop("trace", None)
    if path is None:
        raise ValueError("workload 'trace' needs trace=PATH (a Mooncake JSONL trace)")
    limit = params.pop("limit", None)
    tenants = params.pop("tenants", ("default",))
    if isinstance(tenants, str):
        tenants = tuple(t.strip() for t in tenants.split(",") if t.strip())
    known = {"speed": float, "max_prompt_tokens": int, "max_output_tokens": int, "skip": int}
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"unknown trace parameters {unknown}; known: {sorted(known)}")
    typed: dict[str, Any] = {k: None if v is None else known[k](v) for k, v in params.items()}
    config = TraceConfig(
        seed=seed, rate=rate, region_weights=weights, tenants=tuple(tenants), **typed
    )
    limit = None if limit is None else int(limit) + config.skip
    return TraceWorkload(read_trace(Path(path), limit), shares, config).requests()
