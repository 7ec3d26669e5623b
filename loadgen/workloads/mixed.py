"""Mixed (paper §5.1): ToolBench-like agent traces 50%, LooGLE-like long-document
questions 5%, APPS-like programming problems 45% of requests, each behind its tenant's
private system prompt (paper §5.3: 50 tenants).

The datasets cannot be downloaded here; these are synthetic look-alikes. Their
structure, what repeats and what is fresh:

- **ToolBench-like agent trace** (Qin et al., ToolLLM, 2023): a session. Its first step's
  prompt is system prompt + a tool set's API documentation (a few APIs of one RapidAPI
  category; tool sets are shared by many users, Zipf popularity) + the user's query. Each
  further step is the previous step's prompt + the model's thought/action (its output) +
  the API's response, after the tool call's latency.
- **LooGLE-like long-document question** (Li et al., LooGLE, ACL 2024): one request,
  system prompt + one document (documents are shared, Zipf popularity: several users ask
  about the same one) + a short question.
- **APPS-like problem** (Hendrycks et al., APPS, 2021): one request, system prompt + the
  workload's instruction template + one problem statement (problems drawn uniformly from
  the test split; the same problem asked again is a full-prefix hit) + a short
  per-request instruction.

Shares are per request: each arrival draws its kind, then continues a ready agent trace
or opens a new one (``sessions.TurnScheduler``). Dataset statistics quoted below are from
the dataset papers as we recall them (approximate); everything else is our assumption.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from kvcompass.loadgen.workloads.catalog import MAX_ITEM_TOKENS, MAX_ITEMS
from kvcompass.loadgen.workloads.draws import Zipf
from kvcompass.loadgen.workloads.params import param
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest
from kvcompass.loadgen.workloads.sessions import TurnScheduler
from kvcompass.loadgen.workloads.tenanted import Length, Session, TenantedConfig, TenantedWorkload

__all__ = ["MixedConfig", "MixedWorkload"]

TOOL_SETS, DOCUMENTS, PROBLEMS, TEMPLATE = 10, 11, 12, 13  # catalog kinds
_Content = Callable[["array[int]"], tuple[int, int]]


@dataclass(frozen=True)
class MixedConfig(TenantedConfig):
    """Every parameter of the Mixed workload (``--workload mixed --set NAME=VALUE``)."""

    label: ClassVar[str] = "mixed"

    tool_share: float = param(0.50, "Share of ToolBench-like agent steps (paper §5.1).")
    document_share: float = param(0.05, "Share of LooGLE-like document questions (§5.1).")
    # the APPS-like share is the rest: 0.45 (paper §5.1)
    tool_sets: int = param(
        1000,
        "Distinct tool sets (ToolBench has 16K APIs in 3.4K tools, 49 categories; a "
        "query uses a few APIs of one category: the count of sets is our assumption).",
    )
    tool_set_zipf: float = param(1.0, "Zipf exponent of tool set popularity (assumption).")
    tool_set_tokens_mean: float = param(
        1500.0, "Mean API documentation per tool set, tokens (2-5 APIs; assumption)."
    )
    query_tokens_mean: float = param(80.0, "Mean user query, tokens (assumption).")
    agent_steps_mean: float = param(
        4.0, "Mean steps per agent trace, geometric (ToolBench: ~4 reasoning steps)."
    )
    step_output_tokens_mean: float = param(
        100.0, "Mean thought + action call generated per step (assumption)."
    )
    observation_tokens_mean: float = param(
        400.0, "Mean API response appended before the next step (assumption)."
    )
    tool_latency_s: float = param(
        1.0, "Mean tool call time between two steps, exponential (assumption)."
    )
    documents: int = param(776, "Distinct documents (LooGLE: 776 documents).")
    document_zipf: float = param(0.8, "Zipf exponent of document popularity (assumption).")
    document_tokens_mean: float = param(
        24_000.0, "Mean document length, tokens (LooGLE: ~20K words, >24K tokens)."
    )
    question_tokens_mean: float = param(40.0, "Mean question, tokens (assumption).")
    document_answer_tokens_mean: float = param(60.0, "Mean answer, tokens (assumption).")
    problems: int = param(5000, "Distinct problems (APPS: 5,000 test problems).")
    problem_tokens_mean: float = param(
        450.0, "Mean problem statement, tokens (APPS: ~293 words per problem)."
    )
    template_tokens: int = param(200, "The instruction template before every problem (assumption).")
    solution_tokens_mean: float = param(
        300.0, "Mean generated solution, tokens (assumption; APPS solutions: tens of lines)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        shares = (self.tool_share, self.document_share)
        if min(shares) < 0 or sum(shares) > 1:
            raise ValueError("tool_share and document_share are shares summing to <= 1")
        if min(self.tool_sets, self.documents, self.problems, self.template_tokens) < 1:
            raise ValueError("need at least one tool set, document, problem, template token")
        for name in ("tool_sets", "documents", "problems"):  # each one catalog
            if getattr(self, name) > MAX_ITEMS:
                raise ValueError(f"{name} must be <= {MAX_ITEMS}, got {getattr(self, name)}")
        if self.template_tokens > MAX_ITEM_TOKENS:
            raise ValueError(
                f"template_tokens must be <= {MAX_ITEM_TOKENS}, got {self.template_tokens}"
            )
        # Each as --set names it. A negative exponent makes the least popular items the
        # hot ones; a negative latency puts an agent's next step before its last answer.
        for name, least in (
            ("tool_set_zipf", 0.0),
            ("document_zipf", 0.0),
            ("tool_latency_s", 0.0),
            ("agent_steps_mean", 1.0),
        ):
            if not getattr(self, name) >= least:
                raise ValueError(f"{name} must be >= {least:g}, got {getattr(self, name)}")


def _length(mean: float, cv: float, lo: int, hi: int) -> Length:
    return (mean, cv, lo, max(lo, hi))


class MixedWorkload(TenantedWorkload):
    def __init__(self, config: MixedConfig, shares: RegionShares) -> None:
        super().__init__(config, shares, stream=0x313, id_prefix="m")
        c = self.mixed = config
        self.tool_sets = self.catalog(
            TOOL_SETS, c.tool_sets, _length(c.tool_set_tokens_mean, 0.5, 200, 8192)
        )
        self.documents = self.catalog(
            DOCUMENTS, c.documents, _length(c.document_tokens_mean, 0.3, 4096, 100_000)
        )
        self.problems = self.catalog(
            PROBLEMS, c.problems, _length(c.problem_tokens_mean, 0.5, 64, 4096)
        )
        template = (float(c.template_tokens), 0.0, c.template_tokens, c.template_tokens)
        self.template = self.catalog(TEMPLATE, 1, template).item(0)
        self._tool_zipf = Zipf(c.tool_sets, c.tool_set_zipf)
        self._doc_zipf = Zipf(c.documents, c.document_zipf)
        self._agents: TurnScheduler[Session] = TurnScheduler(c.max_open_sessions)

    def requests(self) -> Iterator[LiveRequest]:
        """Endless with Poisson arrivals (bound it), else as long as the Azure trace."""
        c, d = self.mixed, self.draws
        for n, (at_s, n_in, n_out) in enumerate(self.arrivals()):
            u = d.uniform()
            if u < c.tool_share:
                yield self._agent_step(n, at_s, n_in, n_out)
            elif u < c.tool_share + c.document_share:
                yield self._single(n, at_s, n_in, n_out, "doc", self._document)
            else:
                yield self._single(n, at_s, n_in, n_out, "apps", self._problem)

    def _agent_step(self, n: int, at_s: float, n_in: int, n_out: int) -> LiveRequest:
        c, d = self.mixed, self.draws
        drawn = d.lognormal(c.observation_tokens_mean, 1.0, 8, 4096)
        session = self.continued(self._agents, at_s, drawn)
        if session is None:
            session = self.open("tool", d.geometric(c.agent_steps_mean))
            tools = self.tool_sets.item(self._tool_zipf.pick(d.uniform()))
            session.prompt += tools
            drawn = d.lognormal(c.query_tokens_mean, 0.5, 8, 1024)
        # first step: the query; later ones: the API response to the previous action
        prompt = session.next_prompt(d.tokens(self.fresh(drawn, session.length, n_in)))
        out = n_out or d.lognormal(c.step_output_tokens_mean, 0.5, 8, 1024)
        self.answered(self._agents, session, prompt, out, at_s + d.exponential(c.tool_latency_s))
        return self.request(n, at_s, session, prompt, out)

    def _document(self, prefix: array[int]) -> tuple[int, int]:
        """Appends a document to ``prefix``; (question, answer) lengths."""
        c, d = self.mixed, self.draws
        prefix += self.documents.item(self._doc_zipf.pick(d.uniform()))
        question = d.lognormal(c.question_tokens_mean, 0.5, 4, 512)
        return question, d.lognormal(c.document_answer_tokens_mean, 1.0, 4, 1024)

    def _problem(self, prefix: array[int]) -> tuple[int, int]:
        """Appends the template and a problem to ``prefix``; (instruction, solution)."""
        c, d = self.mixed, self.draws
        prefix += self.template
        prefix += self.problems.item(d.below(c.problems))
        instruction = d.lognormal(16.0, 0.5, 4, 64)
        return instruction, d.lognormal(c.solution_tokens_mean, 0.7, 16, 2048)

    def _single(
        self, n: int, at_s: float, n_in: int, n_out: int, kind: str, content: _Content
    ) -> LiveRequest:
        """A one-request session: ``content`` extends its prefix, sizes fresh and output."""
        session = self.open(kind, 1)
        fresh, out = content(session.prompt)
        prompt = session.next_prompt(self.draws.tokens(self.fresh(fresh, session.length, n_in)))
        return self.request(n, at_s, session, prompt, n_out or out)
