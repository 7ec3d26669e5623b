"""The pipeline core: the stream decisions of the services, free of transports and clocks.

Services wrap these classes with Kafka, Redis and shared memory; tests and the simulator
drive them directly.
"""

from kvcompass.pipeline.faults import Faults, FaultySource
from kvcompass.pipeline.follower import PatchFollower, Position, SnapshotCheck, Verdict

__all__ = ["Faults", "FaultySource", "PatchFollower", "Position", "SnapshotCheck", "Verdict"]
