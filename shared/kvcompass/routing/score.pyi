"""Types of the compiled joint score (score.pyx); the docstrings are there."""

from array import array
from collections.abc import Sequence

from typing_extensions import disjoint_base

from kvcompass.routing.config import Ablations
from kvcompass.routing.policy import Candidate
from kvcompass.topology import Topology

__all__ = ["JointScore"]

@disjoint_base
class JointScore:
    @property
    def n_workers(self) -> int: ...
    @property
    def workers(self) -> range: ...
    @property
    def origin_region(self) -> str: ...
    @property
    def ids(self) -> tuple[str, ...]: ...
    @property
    def regions(self) -> tuple[str, ...]: ...
    @property
    def remote(self) -> tuple[bool, ...]: ...
    @property
    def wan(self) -> tuple[float, ...]: ...
    @property
    def beta(self) -> tuple[float, ...]: ...
    @property
    def gamma(self) -> float: ...
    @property
    def load_aware(self) -> bool: ...
    @property
    def xregion_reuse(self) -> bool: ...
    @property
    def lambda_max(self) -> float: ...
    @property
    def tau_ms(self) -> float: ...
    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        ablations: Ablations,
        lambda_max: float,
        tau_ms: float,
        remote_margin_rtt: float = 0.0,
    ) -> None: ...
    def price(self, queues: Sequence[float]) -> float: ...
    def credited(self, worker: int, matched: int) -> int: ...
    def scores(
        self,
        prompt_tokens: int,
        lengths: Sequence[int],
        tiers: Sequence[int],
        belief: Sequence[float],
        queues: Sequence[float],
        lam: float,
    ) -> list[float]: ...
    def choose(
        self,
        prompt_tokens: int,
        lengths: Sequence[int],
        tiers: Sequence[int],
        belief: Sequence[float],
        queues: Sequence[float],
        top: int,
        turn: int = 0,
    ) -> tuple[float, array[float], list[int]]: ...
    def tie_order(self, turn: int) -> tuple[int, ...]: ...
    def rank(
        self, scores: Sequence[float], queues: Sequence[float], top: int, turn: int = 0
    ) -> list[int]: ...
    def candidates(
        self,
        workers: Sequence[int],
        prompt_tokens: int,
        lengths: Sequence[int],
        tiers: Sequence[int],
        belief: Sequence[float],
        queues: Sequence[float],
        lam: float,
        scores: Sequence[float],
        indexed: Sequence[int] | None = None,
    ) -> tuple[Candidate, ...]: ...
