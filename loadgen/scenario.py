"""The scenario a ``kvcompass demo`` run replayed, written beside its records.

``kvcompass sim agree`` simulates the same scenario from it. Without it, a comparison
could silently run on another topology or workload than the live run did: the demo
writes its long-context topology into its folder, and the built-in name it derives from
is a different index.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvcompass.routing import routing_config

__all__ = ["SCENARIO_FILE", "DemoScenario"]

SCENARIO_FILE: Final = "scenario.json"


@dataclass(frozen=True)
class DemoScenario:
    """What a demo run replayed: topology, workload, time scale and KVCompass's settings.

    ``topology`` is a built-in topology's name, or the name of a TOML file in the demo's
    folder (see :meth:`topology_ref`).
    """

    topology: str
    seconds: float
    rate: float
    seed: int
    time_scale: float
    remote_margin_rtt: float
    pending_credit: bool
    prefix_chain: bool
    tau_ms: float
    lambda_max: float

    def __post_init__(self) -> None:
        """ValueError naming the first setting without meaning (as the demo's flag)."""
        for name in ("seconds", "rate", "time_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
            if not math.isfinite(getattr(self, name)):  # an endless demo, or one at t = 0
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        routing_config(self)  # the router's own checks of the five routing settings

    def write(self, folder: Path) -> Path:
        path = folder / SCENARIO_FILE
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> DemoScenario | None:
        """The scenario written in ``folder``, or None if there is none; ValueError
        naming the file if it is not one."""
        path = folder / SCENARIO_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise TypeError("not a JSON object")
            return cls(**fields)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path} is not a demo scenario: {exc}") from exc

    def topology_ref(self, folder: Path) -> str:
        """The topology as ``topology_of`` takes it: the file in ``folder``, else the name."""
        path = folder / self.topology
        return str(path) if path.is_file() else self.topology
