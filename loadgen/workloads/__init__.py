"""Workload generators (no I/O but reading trace files), shared by the live load
generator and the simulator: each yields :class:`LiveRequest` in arrival order.
:func:`make_workload` builds any of them by name."""

from kvcompass.loadgen.workloads.arrivals import poisson_times, scaled_times
from kvcompass.loadgen.workloads.azure import AzureTrace, read_azure
from kvcompass.loadgen.workloads.chat import (
    ChatConfig,
    ChatWorkload,
    LMSYSConfig,
    WildChatConfig,
)
from kvcompass.loadgen.workloads.mixed import MixedConfig, MixedWorkload
from kvcompass.loadgen.workloads.mooncake import (
    TraceConfig,
    TraceRecord,
    TraceWorkload,
    read_trace,
    trace_sessions,
)
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.registry import WORKLOADS, make_workload, workload_config
from kvcompass.loadgen.workloads.request import LiveRequest, bounded
from kvcompass.loadgen.workloads.synthetic import SyntheticConfig, SyntheticWorkload

__all__ = [
    "WORKLOADS",
    "AzureTrace",
    "ChatConfig",
    "ChatWorkload",
    "LMSYSConfig",
    "LiveRequest",
    "MixedConfig",
    "MixedWorkload",
    "RegionShares",
    "SyntheticConfig",
    "SyntheticWorkload",
    "TraceConfig",
    "TraceRecord",
    "TraceWorkload",
    "WildChatConfig",
    "bounded",
    "make_workload",
    "poisson_times",
    "read_azure",
    "read_trace",
    "scaled_times",
    "trace_sessions",
    "workload_config",
]
