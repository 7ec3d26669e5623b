"""The pipeline's transport- and clock-free core: what a maintenance unit and an edge
decide, as pure classes the services (and the simulator) drive with messages and a clock.
"""

from kvcompass.pipeline.faults import Faults, FaultySource
from kvcompass.pipeline.follower import PatchFollower, Position, SnapshotCheck, Verdict

__all__ = ["Faults", "FaultySource", "PatchFollower", "Position", "SnapshotCheck", "Verdict"]
