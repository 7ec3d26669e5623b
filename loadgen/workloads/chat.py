"""WildChat-like and LMSYS-like multi-turn chats (paper §5.1), each conversation behind
its tenant's private system prompt (paper §5.3: 50 tenants).

The datasets cannot be downloaded here; these are synthetic look-alikes. A conversation
has a geometric number of turns; turn k+1's prompt is turn k's prompt + its answer + a
new user message, sent at least a think time after turn k. A share of conversations
open with a popular first message (a template, a role-play or jailbreak preamble, a
common question) drawn by Zipf popularity from a pool, so different users in different
regions share prefixes beyond the system prompt: the cross-region reuse the paper
measures on WildChat (Fig. 2). Turn and length statistics are from the dataset papers
as we recall them (approximate); the rest is our assumption, said so per parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from kvcompass.loadgen.workloads.catalog import MAX_ITEM_TOKENS, MAX_ITEMS
from kvcompass.loadgen.workloads.draws import Zipf
from kvcompass.loadgen.workloads.params import param
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest
from kvcompass.loadgen.workloads.sessions import TurnScheduler
from kvcompass.loadgen.workloads.tenanted import Session, TenantedConfig, TenantedWorkload

__all__ = ["ChatConfig", "ChatWorkload", "LMSYSConfig", "WildChatConfig"]

OPENERS = 20  # catalog kind


@dataclass(frozen=True)
class ChatConfig(TenantedConfig):
    """Parameters of a multi-turn chat workload; the defaults are WildChat's."""

    label: ClassVar[str] = "chat"

    turns_mean: float = param(
        2.52, "Mean turns per conversation, geometric (WildChat: 2.52 turns on average)."
    )
    user_tokens_mean: float = param(
        296.0, "Mean user message, tokens (WildChat: 295.6 ± 1,609 per user turn)."
    )
    user_tokens_cv: float = param(
        5.4, "User message length's coefficient of variation, lognormal (WildChat: 1609/296)."
    )
    user_tokens_max: int = param(16_384, "Longest user message (our cap).")
    answer_tokens_mean: float = param(
        441.0, "Mean answer, tokens (WildChat: 441.3 ± 410.9 per assistant turn)."
    )
    answer_tokens_cv: float = param(0.93, "Answer length's coefficient of variation (WildChat).")
    answer_tokens_max: int = param(4096, "Longest answer (our cap).")
    think_s_mean: float = param(
        30.0, "Mean time between an answer and the next message, exponential (assumption)."
    )
    opener_share: float = param(
        0.15, "Share of conversations opening with a popular message (assumption)."
    )
    openers: int = param(2000, "Distinct popular opening messages (assumption).")
    opener_zipf: float = param(1.0, "Zipf exponent of opener popularity (assumption).")
    opener_tokens_mean: float = param(
        1000.0, "Mean popular opener, tokens (assumption: long templates dominate reuse)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.turns_mean < 1 or not 0 <= self.opener_share <= 1 or self.openers < 1:
            raise ValueError("need turns_mean >= 1, opener_share in [0, 1], openers >= 1")
        if min(self.user_tokens_mean, self.answer_tokens_mean, self.think_s_mean) <= 0:
            raise ValueError("message, answer and think time means must be positive")
        # Openers are up to 8 × the mean long, each one catalog item.
        if self.openers > MAX_ITEMS:
            raise ValueError(f"openers must be <= {MAX_ITEMS}, got {self.openers}")
        longest = MAX_ITEM_TOKENS // 8
        if not self.opener_tokens_mean <= longest:
            raise ValueError(
                f"opener_tokens_mean must be <= {longest}, got {self.opener_tokens_mean}"
            )
        for name in ("user_tokens_cv", "answer_tokens_cv"):  # a spread: never negative
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class WildChatConfig(ChatConfig):
    """WildChat-like chats (Zhao et al., WildChat, ICLR 2024: ~1M ChatGPT conversations);
    ``--workload wildchat --set NAME=VALUE``."""

    label: ClassVar[str] = "wildchat"


@dataclass(frozen=True)
class LMSYSConfig(ChatConfig):
    """LMSYS-like chats (Zheng et al., LMSYS-Chat-1M, ICLR 2024: 1M Chatbot Arena
    conversations); ``--workload lmsys --set NAME=VALUE``."""

    label: ClassVar[str] = "lmsys"

    turns_mean: float = param(2.0, "Mean turns per conversation (LMSYS-Chat-1M: 2.0).")
    user_tokens_mean: float = param(69.5, "Mean user message, tokens (LMSYS-Chat-1M: 69.5).")
    user_tokens_cv: float = param(2.0, "User message length's CV (assumption; not published).")
    user_tokens_max: int = param(8192, "Longest user message (our cap).")
    answer_tokens_mean: float = param(214.5, "Mean answer, tokens (LMSYS-Chat-1M: 214.5).")
    answer_tokens_cv: float = param(1.0, "Answer length's CV (assumption; not published).")
    answer_tokens_max: int = param(2048, "Longest answer (our cap).")
    think_s_mean: float = param(
        20.0, "Mean think time, exponential (assumption: Arena users compare and move on)."
    )
    opener_share: float = param(
        0.25,
        "Share opening with a popular message (assumption: the dataset paper reports many "
        "duplicated prompts).",
    )
    opener_tokens_mean: float = param(
        150.0, "Mean popular opener, tokens (assumption: short repeated questions)."
    )


class ChatWorkload(TenantedWorkload):
    def __init__(self, config: ChatConfig, shares: RegionShares, id_prefix: str = "c") -> None:
        super().__init__(config, shares, stream=0xC4A7, id_prefix=id_prefix)
        c = self.chat = config
        length = (c.opener_tokens_mean, 1.0, 8, 8 * int(c.opener_tokens_mean))
        self.openers = self.catalog(OPENERS, c.openers, length)
        self._opener_zipf = Zipf(c.openers, c.opener_zipf)
        self._open: TurnScheduler[Session] = TurnScheduler(c.max_open_sessions)

    def requests(self) -> Iterator[LiveRequest]:
        """Endless with Poisson arrivals (bound it), else as long as the Azure trace."""
        c, d = self.chat, self.draws
        for n, (at_s, n_in, n_out) in enumerate(self.arrivals()):
            drawn = d.lognormal(c.user_tokens_mean, c.user_tokens_cv, 1, c.user_tokens_max)
            session = self.continued(self._open, at_s, drawn)
            if session is None:
                session = self.open("chat", d.geometric(c.turns_mean))
                if d.chance(c.opener_share):
                    opener = self.openers.item(self._opener_zipf.pick(d.uniform()))
                    session.prompt += opener
            prompt = session.next_prompt(d.tokens(self.fresh(drawn, session.length, n_in)))
            out = n_out or d.lognormal(
                c.answer_tokens_mean, c.answer_tokens_cv, 1, c.answer_tokens_max
            )
            self.answered(self._open, session, prompt, out, at_s + d.exponential(c.think_s_mean))
            yield self.request(n, at_s, session, prompt, out)
