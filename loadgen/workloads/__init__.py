"""Workload generators (no I/O but reading trace files), shared by the live load
generator and the simulator: each yields :class:`LiveRequest` in arrival order."""

from kvcompass.loadgen.workloads.arrivals import poisson_times, scaled_times
from kvcompass.loadgen.workloads.mooncake import (
    TraceConfig,
    TraceRecord,
    TraceWorkload,
    read_trace,
    trace_sessions,
)
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest, bounded
from kvcompass.loadgen.workloads.synthetic import SyntheticConfig, SyntheticWorkload

__all__ = [
    "LiveRequest",
    "RegionShares",
    "SyntheticConfig",
    "SyntheticWorkload",
    "TraceConfig",
    "TraceRecord",
    "TraceWorkload",
    "bounded",
    "poisson_times",
    "read_trace",
    "scaled_times",
    "trace_sessions",
]
