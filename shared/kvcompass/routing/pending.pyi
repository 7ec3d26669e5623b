"""Types of the compiled pending prefixes (pending.pyx); the docstrings are there."""

from collections.abc import Sequence
from typing import final

__all__ = ["PendingPrefixes"]

@final
class PendingPrefixes:
    @property
    def slack_s(self) -> float: ...
    @property
    def capacity(self) -> int: ...
    def __init__(self, slack_s: float, capacity: int = 65_536) -> None: ...
    def __len__(self) -> int: ...
    def record(
        self, worker: int, pairs: Sequence[tuple[int, int]], now: float, wait_s: float
    ) -> None: ...
    def credit(
        self,
        pairs: Sequence[tuple[int, int]],
        lengths: Sequence[int],
        tiers: Sequence[int],
        now: float,
    ) -> tuple[Sequence[int], Sequence[int]]: ...
