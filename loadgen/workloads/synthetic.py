"""A synthetic mixed workload: tenants with shared system prompts, multi-turn sessions
and long documents, deterministic for a seed.

Arrivals are an open-loop Poisson process at ``rate``. Each arrival either opens a new
session (with probability ``new_session_prob``, or when none is open, never beyond
``max_open_sessions``) or is the next turn of an open session picked uniformly. A
session belongs to one tenant and one origin region (population shares) and starts
from one of its tenant's system prompts; a share ``document_share`` of sessions put a
long document after it (documents are per tenant and picked by Zipf popularity, so
several sessions, from several regions, read the same one). Every turn appends a user
message to the previous turn's prompt and answer, so turn k+1's prompt starts with all
of turn k's. The answer is synthetic (``max_tokens`` tokens from the seed): an emulated
worker's output is not fed back. A session closes after its turn count (geometric, mean
``turns_mean``) or before its prompt would exceed ``max_prompt_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kvcompass.loadgen.workloads.arrivals import poisson_times
from kvcompass.loadgen.workloads.catalog import MAX_ITEMS
from kvcompass.loadgen.workloads.draws import token_array
from kvcompass.loadgen.workloads.params import Params, param
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest

__all__ = ["SyntheticConfig", "SyntheticWorkload"]

Tokens = NDArray[np.uint32]
#: The most system-prompt tokens drawn up front (1 GiB of uint32).
MAX_SYSTEM_TOKENS = 1 << 28


@dataclass(frozen=True)
class SyntheticConfig(Params):
    """Every parameter of the synthetic workload (``kvcompass loadgen --set NAME=VALUE``)."""

    label: ClassVar[str] = "synthetic"

    seed: int = param(0, "Seed of every draw; the same seed gives the same requests.")
    rate: float = param(4.0, "Mean arrivals per second (Poisson, open loop).")
    tenants: int = param(2, "Tenants (named tenant-0, tenant-1, ...).")
    system_prompts_per_tenant: int = param(2, "Distinct system prompts per tenant.")
    system_tokens_min: int = param(1024, "Shortest system prompt (tokens).")
    system_tokens_max: int = param(4096, "Longest system prompt (tokens).")
    new_session_prob: float = param(
        0.25,
        "Probability that an arrival opens a new session rather than continuing one "
        "(1 / turns_mean keeps the number of open sessions steady).",
    )
    max_open_sessions: int = param(
        256, "Open sessions at most; when full, arrivals continue sessions."
    )
    turns_mean: float = param(4.0, "Mean turns per session (geometric, at least 1).")
    user_tokens_min: int = param(32, "Shortest user message per turn (tokens).")
    user_tokens_max: int = param(512, "Longest user message per turn (tokens).")
    answer_tokens_min: int = param(16, "Fewest tokens a turn generates (max_tokens).")
    answer_tokens_max: int = param(128, "Most tokens a turn generates (max_tokens).")
    document_share: float = param(0.25, "Share of sessions that start with a long document.")
    documents_per_tenant: int = param(6, "Distinct documents per tenant.")
    document_tokens_min: int = param(8192, "Shortest document (tokens).")
    document_tokens_max: int = param(32768, "Longest document (tokens).")
    document_zipf: float = param(
        1.2, "Zipf exponent of document popularity (0 = uniform; higher = a few hot ones)."
    )
    max_prompt_tokens: int = param(
        65536, "A session closes rather than send a prompt longer than this."
    )
    vocab: int = param(128_000, "Token ids are drawn from [0, vocab).")

    def __post_init__(self) -> None:
        for lo, hi in (
            ("system_tokens_min", "system_tokens_max"),
            ("user_tokens_min", "user_tokens_max"),
            ("answer_tokens_min", "answer_tokens_max"),
            ("document_tokens_min", "document_tokens_max"),
        ):
            if not 1 <= getattr(self, lo) <= getattr(self, hi):
                raise ValueError(f"need 1 <= {lo} <= {hi}")
        if not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.documents_per_tenant > MAX_ITEMS:  # a popularity array of that many
            raise ValueError(
                f"documents_per_tenant must be <= {MAX_ITEMS}, got {self.documents_per_tenant}"
            )
        if self.max_prompt_tokens < 1:  # else every prompt is cut to nothing
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        # Every system prompt is drawn before the first request: bound their memory (a
        # hundred million tenants took 16 GB and never started).
        most = self.tenants * self.system_prompts_per_tenant * self.system_tokens_max
        if most > MAX_SYSTEM_TOKENS:
            raise ValueError(
                f"tenants × system_prompts_per_tenant × system_tokens_max must be <= "
                f"{MAX_SYSTEM_TOKENS:,} tokens, got {most:,}"
            )
        if self.turns_mean < 1 or self.vocab < 2:
            raise ValueError(
                f"need turns_mean >= 1 and vocab >= 2, got {self.turns_mean} and {self.vocab}"
            )
        counts = (self.tenants, self.system_prompts_per_tenant, self.documents_per_tenant)
        if min(*counts, self.max_open_sessions) < 1:
            raise ValueError("need at least one tenant, system prompt, document and session")
        if not (0 <= self.new_session_prob <= 1 and 0 <= self.document_share <= 1):
            raise ValueError("new_session_prob and document_share are probabilities")
        if not self.document_zipf >= 0:  # negative: the least popular documents win
            raise ValueError(f"document_zipf must be >= 0, got {self.document_zipf}")


@dataclass
class _Session:
    number: int
    tenant: int
    region: str
    prompt: Tokens  # the next turn's prompt, without its user message yet
    turns_left: int


class SyntheticWorkload:
    def __init__(self, config: SyntheticConfig, shares: RegionShares) -> None:
        self.config = config
        self.shares = shares
        c = config
        rng = np.random.default_rng([c.seed, 1])
        self._system = [
            [
                self._draw(rng, c.system_tokens_min, c.system_tokens_max)
                for _ in range(c.system_prompts_per_tenant)
            ]
            for _ in range(c.tenants)
        ]
        ranks = np.arange(1, c.documents_per_tenant + 1, dtype=np.float64)
        popularity = ranks**-c.document_zipf
        self._doc_p = popularity / popularity.sum()
        self._docs: dict[tuple[int, int], Tokens] = {}

    def _draw(self, rng: np.random.Generator, lo: int, hi: int) -> Tokens:
        n = int(rng.integers(lo, hi + 1))
        return rng.integers(0, self.config.vocab, n, dtype=np.uint32)

    def document(self, tenant: int, doc: int) -> Tokens:
        """Document ``doc`` of ``tenant`` (its own seed stream: order-free, cached)."""
        key = (tenant, doc)
        if key not in self._docs:
            c = self.config
            rng = np.random.default_rng([c.seed, 2, tenant, doc])
            self._docs[key] = self._draw(rng, c.document_tokens_min, c.document_tokens_max)
        return self._docs[key]

    def requests(self) -> Iterator[LiveRequest]:
        """Endless, in arrival order (bound it with a duration or a count)."""
        c = self.config
        rng = np.random.default_rng([c.seed, 3])
        open_sessions: list[_Session] = []
        opened = 0
        for n, at_s in enumerate(poisson_times(c.rate, c.seed)):
            room = len(open_sessions) < c.max_open_sessions
            if not open_sessions or (room and rng.random() < c.new_session_prob):
                session = self._open(rng, opened)
                opened += 1
                open_sessions.append(session)
            else:
                session = open_sessions[int(rng.integers(len(open_sessions)))]
            user = self._draw(rng, c.user_tokens_min, c.user_tokens_max)
            answer = int(rng.integers(c.answer_tokens_min, c.answer_tokens_max + 1))
            prompt = np.concatenate([session.prompt, user])
            if len(prompt) > c.max_prompt_tokens:  # too long to continue: a fresh one
                open_sessions.remove(session)
                session = self._open(rng, opened)
                opened += 1
                open_sessions.append(session)
                prompt = np.concatenate([session.prompt, user])[: c.max_prompt_tokens]
            yield LiveRequest(
                at_s=at_s,
                origin_region=session.region,
                tenant=f"tenant-{session.tenant}",
                tokens=token_array(prompt),
                max_tokens=answer,
                session=f"s{session.number}",
                request_id=f"s{n:06d}",
            )
            session.turns_left -= 1
            if session.turns_left <= 0:
                open_sessions.remove(session)
            else:  # the next turn repeats this prompt and its (synthetic) answer
                session.prompt = np.concatenate([prompt, self._draw(rng, answer, answer)])

    def _open(self, rng: np.random.Generator, number: int) -> _Session:
        c = self.config
        tenant = int(rng.integers(c.tenants))
        prompt = self._system[tenant][int(rng.integers(c.system_prompts_per_tenant))]
        if rng.random() < c.document_share:
            doc = self.document(tenant, int(rng.choice(len(self._doc_p), p=self._doc_p)))
            prompt = np.concatenate([prompt, doc])
        turns = int(rng.geometric(1.0 / c.turns_mean))
        region = self.shares.pick(float(rng.random()))
        return _Session(number, tenant, region, prompt, turns)
