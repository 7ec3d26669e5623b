"""WildChat- and LMSYS-like chats: determinism, conversations that extend their own
previous turn after a think time, turn counts and lengths near the datasets' means,
tenants' private system prompts, popular openers shared across regions."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from functools import cache

import numpy as np
import pytest

from kvcompass.loadgen.workloads import LiveRequest, LMSYSConfig, WildChatConfig, make_workload
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("sim-8region")
BLOCK = 16


@cache
def _chat(name: str, seed: int = 1, n: int = 20_000) -> tuple[LiveRequest, ...]:
    # 4 req/s over ~80 min: the open-session cap is never reached, think times hold
    return tuple(itertools.islice(make_workload(name, TOPOLOGY, 4.0, seed), n))


def _sessions(requests: tuple[LiveRequest, ...]) -> dict[str, list[LiveRequest]]:
    out: dict[str, list[LiveRequest]] = defaultdict(list)
    for r in requests:
        out[r.session].append(r)
    return out


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@pytest.mark.parametrize("name", ["wildchat", "lmsys"])
def test_chats_are_deterministic_for_a_seed(name: str) -> None:
    a = list(itertools.islice(make_workload(name, TOPOLOGY, 50.0, 9), 2000))
    b = list(itertools.islice(make_workload(name, TOPOLOGY, 50.0, 9), 2000))
    assert [(r.at_s, r.origin_region, r.tenant, r.tokens, r.max_tokens, r.session) for r in a] == [
        (r.at_s, r.origin_region, r.tenant, r.tokens, r.max_tokens, r.session) for r in b
    ]
    c = list(itertools.islice(make_workload(name, TOPOLOGY, 50.0, 10), 2000))
    assert [r.tokens for r in c] != [r.tokens for r in a]


@pytest.mark.parametrize("name", ["wildchat", "lmsys"])
def test_turns_extend_their_own_previous_prompt_and_answer_after_thinking(name: str) -> None:
    sessions = _sessions(_chat(name))
    gaps = []
    for turns in sessions.values():
        assert len({(r.tenant, r.origin_region) for r in turns}) == 1
        for prev, cur in itertools.pairwise(turns):
            assert cur.tokens[: len(prev.tokens)] == prev.tokens
            assert len(cur.tokens) > len(prev.tokens) + prev.max_tokens
            gaps.append(cur.at_s - prev.at_s)
    think = (WildChatConfig if name == "wildchat" else LMSYSConfig)().think_s_mean
    # a turn waits at least its exponential think time for the next arrival: the mean gap
    # is the think mean plus part of an inter-arrival time
    assert np.mean(gaps) == pytest.approx(think, rel=0.15)


@pytest.mark.parametrize(
    ("name", "config"), [("wildchat", WildChatConfig()), ("lmsys", LMSYSConfig())]
)
def test_turn_counts_and_answer_lengths_follow_the_dataset_means(
    name: str, config: WildChatConfig | LMSYSConfig
) -> None:
    requests = _chat(name)
    sessions = _sessions(requests)
    # sessions still open at the end are cut short: count those begun 20 think times before
    cutoff = requests[-1].at_s - 20 * config.think_s_mean
    done = [len(t) for t in sessions.values() if t[0].at_s < cutoff]
    assert np.mean(done) == pytest.approx(config.turns_mean, rel=0.1)
    answers = [r.max_tokens for r in requests]
    assert np.mean(answers) == pytest.approx(config.answer_tokens_mean, rel=0.1)


def test_tenants_private_prompts_and_popular_openers_across_regions() -> None:
    requests = _chat("wildchat")
    first: dict[str, Sequence[int]] = {}
    for r in requests:
        first.setdefault(r.tenant, r.tokens)
    assert len(first) == 50
    for a, b in itertools.combinations(first.values(), 2):
        assert _common(a, b) < BLOCK
    # the same tenant's conversations from different regions share a popular opener
    openers: dict[tuple[str, tuple[int, ...]], set[str]] = defaultdict(set)
    for turns in _sessions(requests).values():
        r = turns[0]
        system = _common(r.tokens, first[r.tenant])
        openers[(r.tenant, tuple(r.tokens[system : system + 64]))].add(r.origin_region)
    assert max(len(regions) for regions in openers.values()) >= 2


def test_a_session_ends_rather_than_pass_the_prompt_cap() -> None:
    requests = list(
        itertools.islice(make_workload("wildchat", TOPOLOGY, 50.0, 2, max_prompt_tokens=3000), 3000)
    )
    assert max(len(r.tokens) for r in requests) <= 3000
    assert max(len(t) for t in _sessions(tuple(requests)).values()) >= 2
