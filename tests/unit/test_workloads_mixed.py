"""The Mixed workload: determinism, the ToolBench / LooGLE / APPS shares, tenants'
private system prompts, agent traces that extend their own previous step."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from functools import cache
from typing import Any

import pytest

from kvcompass.loadgen.workloads import LiveRequest, MixedConfig, make_workload
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("sim-8region")
BLOCK = 16  # the KV block: a shared prefix shorter than this shares no KV


def _mixed(seed: int = 3, n: int = 20_000, **params: Any) -> list[LiveRequest]:
    return list(itertools.islice(make_workload("mixed", TOPOLOGY, 200.0, seed, **params), n))


@cache
def _default() -> list[LiveRequest]:
    return _mixed()


def _kind(request: LiveRequest) -> str:
    return request.session.rstrip("0123456789")


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _view(requests: list[LiveRequest]) -> list[tuple[object, ...]]:
    return [
        (r.at_s, r.origin_region, r.tenant, r.tokens, r.max_tokens, r.session, r.request_id)
        for r in requests
    ]


def test_mixed_is_deterministic_for_a_seed() -> None:
    a, b = _mixed(n=3000), _mixed(n=3000)
    assert _view(a) == _view(b)
    other = _mixed(seed=4, n=3000)
    assert [r.tokens for r in other] != [r.tokens for r in a]
    assert len({r.request_id for r in a}) == len(a)
    assert all(x.at_s < y.at_s for x, y in itertools.pairwise(a))


def test_mixed_shares_are_the_papers_within_one_and_a_half_points() -> None:
    # §5.1: ToolBench 50%, LooGLE 5%, APPS 45% of requests; 20,000 draws put each share
    # within 0.015 (> 4 binomial standard deviations) of its target
    counts = Counter(_kind(r) for r in _default())
    shares = {k: v / len(_default()) for k, v in counts.items()}
    assert shares.keys() == {"tool", "doc", "apps"}
    assert shares["tool"] == pytest.approx(0.50, abs=0.015)
    assert shares["doc"] == pytest.approx(0.05, abs=0.015)
    assert shares["apps"] == pytest.approx(0.45, abs=0.015)
    skewed = Counter(_kind(r) for r in _mixed(n=4000, tool_share=0.2, document_share=0.3))
    assert skewed["doc"] / 4000 == pytest.approx(0.3, abs=0.03)


def test_tenants_never_share_a_system_prompt_and_each_keeps_its_own() -> None:
    requests = _default()
    first: dict[str, Sequence[int]] = {}
    for r in requests:
        first.setdefault(r.tenant, r.tokens)
    assert len(first) == 50  # paper §5.3
    for (_, a), (_, b) in itertools.combinations(first.items(), 2):
        assert _common(a, b) < BLOCK
    # within a tenant every request starts with the same system prompt (>= 128 tokens)
    for tenant, prompt in first.items():
        same = [r.tokens for r in requests if r.tenant == tenant][:50]
        assert min(_common(prompt, t) for t in same) >= 128, tenant


def test_agent_steps_extend_their_own_previous_step_and_answer() -> None:
    by_session: dict[str, list[LiveRequest]] = defaultdict(list)
    for r in _default():
        if _kind(r) == "tool":
            by_session[r.session].append(r)
    steps = [len(s) for s in by_session.values()]
    assert max(steps) >= 5
    assert sum(steps) / len(steps) > 2.5
    for session in by_session.values():
        assert len({(r.tenant, r.origin_region) for r in session}) == 1
        for prev, cur in itertools.pairwise(session):
            assert cur.tokens[: len(prev.tokens)] == prev.tokens
            assert len(cur.tokens) > len(prev.tokens) + prev.max_tokens  # + answer + result
            assert cur.at_s > prev.at_s


def test_documents_and_problems_are_shared_prefixes_across_users_and_regions() -> None:
    docs: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in _default():
        if _kind(r) == "doc":  # the system prompt and then a >= 4096-token document
            docs[(r.tenant, hash(tuple(r.tokens[:6000])))].add(r.origin_region)
    assert max(len(regions) for regions in docs.values()) >= 2
    apps = [r.tokens for r in _default() if _kind(r) == "apps" and r.tenant == "tenant-0"]
    shared = [_common(a, b) for a, b in itertools.pairwise(apps)]
    assert min(shared) >= 128 + 200  # system prompt + instruction template


def test_mixed_config_rejects_shares_beyond_one() -> None:
    with pytest.raises(ValueError, match="shares"):
        MixedConfig(tool_share=0.7, document_share=0.4)
    with pytest.raises(ValueError, match="unknown mixed parameters"):
        make_workload("mixed", TOPOLOGY, 1.0, 0, tool_shar=0.5)
