"""The event-driven simulator (``kvcompass sim``): the real routing, index and worker
code on virtual time. :func:`simulate` runs one configuration over a workload."""

from kvcompass.loadgen.sim.config import SimConfig
from kvcompass.loadgen.sim.records import LoadSample, SimRecord, SimResult
from kvcompass.loadgen.sim.simulator import Simulation, simulate

__all__ = ["LoadSample", "SimConfig", "SimRecord", "SimResult", "Simulation", "simulate"]
