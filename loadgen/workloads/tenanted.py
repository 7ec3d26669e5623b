"""What the dataset-like generators (Mixed, WildChat, LMSYS) share: tenants with private
system prompts, origin regions by population share, arrival times (Poisson or an Azure
trace, optionally with its lengths) and multi-turn sessions whose every turn extends the
session's previous prompt and answer.

None of these datasets can be downloaded here: every prompt is synthetic token ids with
the structure (what is shared, by whom, how long) of its dataset as described in the
dataset's paper or assumed by us; each parameter says which.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvcompass.loadgen.workloads.arrivals import poisson_times
from kvcompass.loadgen.workloads.azure import read_azure
from kvcompass.loadgen.workloads.catalog import MAX_ITEM_TOKENS, MAX_ITEMS, Catalog
from kvcompass.loadgen.workloads.draws import TOKEN_TYPECODE, Draws
from kvcompass.loadgen.workloads.params import Params, param
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest
from kvcompass.loadgen.workloads.sessions import TurnScheduler

__all__ = ["Length", "Session", "TenantedConfig", "TenantedWorkload"]

# Catalog kinds: each kind of shared content has its own seed stream.
SYSTEM_PROMPTS = 1

Length = tuple[float, float, int, int]  # mean, coefficient of variation, min, max (tokens)


@dataclass(frozen=True)
class TenantedConfig(Params):
    """Parameters every dataset-like generator has (sources in each doc)."""

    seed: int = param(0, "Seed of every draw; the same seed gives the same requests.")
    rate: float = param(16.0, "Mean arrivals per second (Poisson, open loop); ignored with azure.")
    tenants: int = param(
        50,
        "Tenants, each with one private system prompt before all its prompts, so no two "
        "tenants share a prefix (paper §5.3: 50 tenants, each with a unique private "
        "system prompt).",
    )
    system_tokens_mean: float = param(800.0, "Mean system prompt length (our assumption).")
    system_tokens_cv: float = param(
        0.5, "System prompt length's coefficient of variation (lognormal; our assumption)."
    )
    system_tokens_min: int = param(128, "Shortest system prompt (our assumption).")
    system_tokens_max: int = param(4096, "Longest system prompt (our assumption).")
    max_open_sessions: int = param(
        1024,
        "Open multi-turn sessions at most (each holds its prompt); at the cap the session "
        "ready soonest continues before its think time is over (our assumption).",
    )
    max_prompt_tokens: int = param(
        131_072,
        "A session ends rather than exceed this; single requests are cut to it, keeping "
        "their prefix (Llama-3.1-8B's 128K context, paper §5.3).",
    )
    vocab: int = param(128_000, "Token ids are drawn from [0, vocab) (Llama-3's ~128K).")
    azure: str = param(
        "",
        "Path of an Azure LLM inference trace CSV (azure2023_code / _conv .csv.gz in "
        "../shared/traces): its arrival times replace the Poisson process.",
    )
    speed: float = param(1.0, "Azure trace time divided by this (2 = twice the rate).")
    azure_lengths: bool = param(
        False,
        "With azure: each request's output length is the trace's, and its fresh tokens "
        "are sized so the prompt has the trace's input length (never less than its "
        "shared prefix + 1).",
    )

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if not self.speed > 0 or self.vocab < 2:
            raise ValueError(f"need speed > 0 and vocab >= 2, got {self.speed} and {self.vocab}")
        if min(self.tenants, self.max_open_sessions, self.max_prompt_tokens) < 1:
            raise ValueError("need at least one tenant, open session and prompt token")
        if self.tenants > MAX_ITEMS:  # one system prompt each, from one catalog
            raise ValueError(f"tenants must be <= {MAX_ITEMS}, got {self.tenants}")
        if self.azure_lengths and not self.azure:
            raise ValueError("azure_lengths needs an azure trace")
        if not self.system_tokens_mean > 0:
            raise ValueError(f"system_tokens_mean must be positive, got {self.system_tokens_mean}")
        if not self.system_tokens_cv >= 0:  # a spread: negative read as "bad catalog"
            raise ValueError(f"system_tokens_cv must be >= 0, got {self.system_tokens_cv}")
        low, high = self.system_tokens_min, self.system_tokens_max
        if not 1 <= low <= high <= MAX_ITEM_TOKENS:  # else "bad catalog" too
            raise ValueError(
                f"need 1 <= system_tokens_min <= system_tokens_max <= {MAX_ITEM_TOKENS}, "
                f"got {low} and {high}"
            )

    @property
    def system_length(self) -> Length:
        return (
            self.system_tokens_mean,
            self.system_tokens_cv,
            self.system_tokens_min,
            self.system_tokens_max,
        )


@dataclass(slots=True)
class Session:
    """An open conversation (or agent trace). A new one holds its shared prefix; after a
    turn, ``prompt`` is that turn's prompt (the request's own list, never modified) and
    ``answer`` its synthetic answer, which the next turn appends before its fresh tokens."""

    name: str
    tenant: int
    region: str
    prompt: array[int]
    turns_left: int
    answer: array[int] = field(default_factory=lambda: array(TOKEN_TYPECODE))

    @property
    def length(self) -> int:
        """Tokens the next prompt has before its fresh ones."""
        return len(self.prompt) + len(self.answer)

    def next_prompt(self, fresh: array[int]) -> array[int]:
        """The next turn's prompt: everything so far, then ``fresh``."""
        prompt = self.prompt + self.answer if self.answer else self.prompt
        prompt += fresh  # a new session's prefix array is its own, so in place is safe
        return prompt


class TenantedWorkload:
    """The shared machinery; subclasses write ``requests()``."""

    def __init__(
        self, config: TenantedConfig, shares: RegionShares, stream: int, id_prefix: str
    ) -> None:
        self.config = config
        self.id_prefix = id_prefix
        self.shares = shares
        c = config
        self.draws = Draws(c.seed, stream, c.vocab)
        self.system = Catalog(c.seed, SYSTEM_PROMPTS, c.tenants, c.system_length, c.vocab)
        self.opened = 0

    def catalog(self, kind: int, size: int, length: Length) -> Catalog:
        return Catalog(self.config.seed, kind, size, length, self.config.vocab)

    def arrivals(self) -> Iterator[tuple[float, int, int]]:
        """(arrival s, trace input tokens, trace output tokens); 0 = no trace length."""
        c = self.config
        if c.azure:
            trace = read_azure(Path(c.azure))
            for at_s, n_in, n_out in trace.arrivals(c.speed):
                yield (at_s, n_in, n_out) if c.azure_lengths else (at_s, 0, 0)
        else:
            for at_s in poisson_times(c.rate, c.seed):
                yield at_s, 0, 0

    def open(self, kind: str, turns: int) -> Session:
        """A new session: a tenant, a region by population share, the system prompt."""
        tenant = self.draws.below(self.config.tenants)
        region = self.shares.pick(self.draws.uniform())
        self.opened += 1
        return Session(f"{kind}{self.opened}", tenant, region, self.system.item(tenant), turns)

    def fresh(self, drawn: int, prefix: int, trace_input: int) -> int:
        """Fresh tokens of a turn: drawn, or the trace's input length less the prefix."""
        return max(1, trace_input - prefix) if trace_input else drawn

    def request(
        self, n: int, at_s: float, session: Session, prompt: array[int], out: int
    ) -> LiveRequest:
        cap = self.config.max_prompt_tokens
        return LiveRequest(
            at_s=at_s,
            origin_region=session.region,
            tenant=f"tenant-{session.tenant}",
            tokens=prompt if len(prompt) <= cap else prompt[:cap],
            max_tokens=max(1, out),
            session=session.name,
            request_id=f"{self.id_prefix}{n:07d}",
        )

    def continued(
        self, scheduler: TurnScheduler[Session], at_s: float, fresh: int
    ) -> Session | None:
        """The session whose next turn arrives at ``at_s`` (None: open one), unless
        ``fresh`` more tokens would take it past the prompt cap: then it ends."""
        session = scheduler.next(at_s)
        if session is not None and session.length + fresh > self.config.max_prompt_tokens:
            return None
        return session

    def answered(
        self,
        scheduler: TurnScheduler[Session],
        session: Session,
        prompt: array[int],
        answer: int,
        ready_s: float,
    ) -> None:
        """After a turn: the session's next prompt starts with this one and its
        (synthetic) answer, not before ``ready_s``."""
        session.turns_left -= 1
        if session.turns_left > 0 and len(prompt) + answer < self.config.max_prompt_tokens:
            session.prompt, session.answer = prompt, self.draws.tokens(max(1, answer))
            scheduler.wait(session, ready_s)
