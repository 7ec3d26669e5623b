"""Types of the compiled emulated engine (engine.pyx); the docstrings are there."""

from typing_extensions import disjoint_base

from kvcompass.keys import Namespace, TokenIds
from kvcompass.pipeline.clock import Clock
from kvcompass.worker.cache import CacheMatch, PrefixCache
from kvcompass.worker.completion import MigrationMode as MigrationMode
from kvcompass.worker.completion import Request as Request
from kvcompass.worker.completion import Timings as Timings
from kvcompass.worker.cost import CostModel

__all__ = [
    "Emitted",
    "EmulatedEngine",
    "MigrationMode",
    "Request",
    "Sequence",
    "Timings",
    "queue_vector",
]

@disjoint_base
class Sequence:
    number: int
    request: Request
    arrived_at: float
    expected_ms: float
    reused: CacheMatch
    started_at: float | None
    reload_ms: float
    prefill_ms: float
    first_token_at: float | None
    finished_at: float | None
    generated: int
    aborted: bool
    def __init__(
        self, number: int, request: Request, arrived_at: float, expected_ms: float
    ) -> None: ...
    @property
    def done(self) -> bool: ...
    def timings(self) -> Timings: ...

@disjoint_base
class Emitted:
    @property
    def sequence(self) -> Sequence: ...
    @property
    def index(self) -> int: ...
    @property
    def at(self) -> float: ...
    @property
    def last(self) -> bool: ...
    def __init__(self, sequence: Sequence, index: int, at: float, last: bool) -> None: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@disjoint_base
class EmulatedEngine:
    @property
    def cache(self) -> PrefixCache: ...
    @property
    def cost(self) -> CostModel: ...
    stream: bool
    def __init__(
        self, cache: PrefixCache, cost: CostModel, clock: Clock, *, stream: bool = True
    ) -> None: ...
    def submit(self, request: Request) -> Sequence: ...
    def migrate(self, namespace: Namespace, tokens: TokenIds, mode: MigrationMode) -> None: ...
    def reset(self) -> list[Sequence]: ...
    def next_event_at(self) -> float | None: ...
    def next_notable_at(self) -> float | None: ...
    def advance(self) -> list[Emitted]: ...
    def queue_ms(self) -> float: ...
    @property
    def running(self) -> int: ...

def queue_vector(
    indices: tuple[int, ...], engines: tuple[EmulatedEngine, ...]
) -> dict[int, float]: ...
