"""Workload generators: determinism, prefix sharing, trace mapping, Poisson arrivals."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from kvcompass.loadgen.workloads import (
    LiveRequest,
    RegionShares,
    SyntheticConfig,
    SyntheticWorkload,
    TraceConfig,
    TraceRecord,
    TraceWorkload,
    poisson_times,
    read_trace,
    scaled_times,
    trace_sessions,
)
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")
SHARES = RegionShares.of(TOPOLOGY)
SMALL = SyntheticConfig(
    seed=5,
    system_tokens_min=64,
    system_tokens_max=128,
    document_tokens_min=512,
    document_tokens_max=1024,
    user_tokens_min=8,
    user_tokens_max=32,
    document_share=0.5,
)


def _synthetic(config: SyntheticConfig = SMALL, n: int = 400) -> list[LiveRequest]:
    return list(itertools.islice(SyntheticWorkload(config, SHARES).requests(), n))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def test_synthetic_is_deterministic_for_a_seed() -> None:
    a, b = _synthetic(), _synthetic()
    assert [(r.at_s, r.origin_region, r.tenant, r.tokens, r.max_tokens) for r in a] == [
        (r.at_s, r.origin_region, r.tenant, r.tokens, r.max_tokens) for r in b
    ]
    other = _synthetic(SyntheticConfig(**{**SMALL.__dict__, "seed": 6}))
    assert [r.tokens for r in other] != [r.tokens for r in a]
    assert len({r.request_id for r in a}) == len(a)


def test_synthetic_turns_extend_the_previous_prompt_and_answer() -> None:
    by_session: dict[str, list[LiveRequest]] = {}
    for r in _synthetic():
        by_session.setdefault(r.session, []).append(r)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert len(multi) > 10
    for turns in multi:
        assert len({(t.tenant, t.origin_region) for t in turns}) == 1  # one user
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.tokens[: len(prev.tokens)] == prev.tokens
            # previous prompt + its answer (max_tokens) + a new user message
            assert len(nxt.tokens) >= len(prev.tokens) + prev.max_tokens + SMALL.user_tokens_min


def test_synthetic_tenants_share_system_prompts_and_documents_but_not_each_others() -> None:
    requests = _synthetic()
    firsts: dict[str, set[tuple[int, ...]]] = {}
    for r in requests:
        firsts.setdefault(r.tenant, set()).add(tuple(r.tokens[: SMALL.system_tokens_min]))
    assert set(firsts) == {"tenant-0", "tenant-1"}
    for tenant, heads in firsts.items():
        assert len(heads) <= SMALL.system_prompts_per_tenant, tenant  # shared prompts
    assert not firsts["tenant-0"] & firsts["tenant-1"]
    # Documents: different sessions (and regions) share a long prefix beyond the system
    # prompt, which only a shared document explains.
    first_turns = {r.session: r for r in requests}.values()
    long_shared = [
        (a, b)
        for a, b in itertools.combinations(first_turns, 2)
        if a.tenant == b.tenant and _common_prefix(a.tokens, b.tokens) > 512 + 128
    ]
    assert long_shared
    assert any(a.origin_region != b.origin_region for a, b in long_shared)


def test_synthetic_respects_the_prompt_cap_and_the_parameter_text() -> None:
    capped = SyntheticConfig(**{**SMALL.__dict__, "max_prompt_tokens": 1500})
    assert max(len(r.tokens) for r in _synthetic(capped)) <= 1500
    config = SyntheticConfig().with_values({"rate": "8", "tenants": "3"})
    assert (config.rate, config.tenants) == (8.0, 3)
    with pytest.raises(ValueError, match="unknown synthetic parameters"):
        SyntheticConfig().with_values({"rtae": "8"})
    assert {name for name, _, _ in SyntheticConfig.parameters()} >= {"rate", "document_zipf"}


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    times = np.fromiter(itertools.islice(poisson_times(50.0, seed=3), 20_000), np.float64)
    assert np.all(np.diff(times) > 0)
    rate = len(times) / times[-1]
    assert 50.0 * 0.97 < rate < 50.0 * 1.03
    gaps = np.diff(times)
    assert 0.95 < gaps.std() / gaps.mean() < 1.05  # coefficient of variation 1: Poisson
    synthetic = _synthetic(SyntheticConfig(**{**SMALL.__dict__, "rate": 20.0}), 4000)
    assert 20.0 * 0.95 < len(synthetic) / synthetic[-1].at_s < 20.0 * 1.05
    assert list(scaled_times([1000.0, 1500.0, 3000.0], speed=2.0)) == [0.0, 0.25, 1.0]


def test_region_shares_follow_the_weights() -> None:
    assert SHARES.shares == pytest.approx((8 / 14, 2 / 14, 4 / 14))  # worker counts
    counts = Counter(SHARES.of_session(1, s) for s in range(20_000))
    for region, share in zip(SHARES.regions, SHARES.shares, strict=True):
        assert counts[region] / 20_000 == pytest.approx(share, abs=0.02)
    only_eu = RegionShares.of(TOPOLOGY, [0, 1, 0])
    assert {only_eu.of_session(1, s) for s in range(100)} == {"eu"}
    with pytest.raises(ValueError, match="weights"):
        RegionShares.of(TOPOLOGY, [1, 1])


@pytest.mark.parametrize("weights", [[0, 0, 0], [-1, 1, 1], [math.nan, 1, 1], [math.inf, 1, 1]])
def test_region_weights_without_a_share_are_refused(weights: list[float]) -> None:
    # NaN and inf passed: NaN shares, or every share 0 but one's NaN, drawn silently.
    with pytest.raises(ValueError, match=r"must be finite, >= 0 and with a positive sum"):
        RegionShares.of(TOPOLOGY, weights)


def _record(t: float, ids: list[int], length: int, out: int = 10) -> TraceRecord:
    return TraceRecord(t, length, out, tuple(ids))


# Block 0 is in every record (a universal system block, as in the conversation trace).
# Records 0 → 2 → 4 are one conversation (each contains all full blocks of the one
# before); 6 shares blocks [0, 11] with 5 but not 5's last full block 12.
RECORDS = [
    _record(0, [0, 1, 2], 1200),  # full blocks [0, 1]
    _record(1000, [0, 7], 700),
    _record(2000, [0, 1, 2, 3], 1800),  # continues 0: full [0, 1, 2]
    _record(2000, [0, 1, 9], 1100),  # contains 0's full blocks [0, 1]: continues 0 too
    _record(5000, [0, 1, 2, 3, 4], 2100),  # continues 2
    _record(5000, [0, 11, 12, 13], 2000),  # full blocks [0, 11, 12]
    _record(5000, [0, 11, 14], 1100),  # another user of 5's first two blocks
    *(_record(6000, [0, 100 + i], 600) for i in range(6)),  # single-turn users
]


def test_trace_mapping_preserves_exactly_the_shared_block_prefixes() -> None:
    workload = TraceWorkload(RECORDS, SHARES, TraceConfig(seed=1))
    tokens = [workload.tokens(r) for r in RECORDS]
    assert [len(t) for t in tokens] == [r.input_length for r in RECORDS]
    for (i, a), (j, b) in itertools.combinations(enumerate(RECORDS), 2):
        shared_blocks = _common_prefix(list(a.hash_ids), list(b.hash_ids))
        common = _common_prefix(tokens[i], tokens[j])
        limit = min(a.input_length, b.input_length)
        # Equal ids: equal tokens; the first different id: different tokens from there.
        assert common == min(shared_blocks * 512, limit), (i, j, common)
    other_seed = TraceWorkload(RECORDS, SHARES, TraceConfig(seed=2)).tokens(RECORDS[0])
    assert other_seed != tokens[0]
    assert all(0 <= t < 128_000 for t in tokens[4])


def test_trace_sessions_are_conversations_not_shared_prefixes() -> None:
    sessions = trace_sessions(RECORDS, 512)
    assert sessions[2] == sessions[0]  # next turn
    assert sessions[4] == sessions[0]
    assert sessions[1] != sessions[0]  # shares only the universal block 0
    # 3 repeats 0's full blocks [0, 1] too, so it continues it as well: block ids alone
    # cannot tell a second user of a shared prefix from the same user's next turn.
    assert sessions[3] == sessions[0]
    assert sessions[6] != sessions[5]  # lacks 5's block 12, so not a turn after 5
    assert len(set(sessions[7:])) == 6
    lone = [_record(0, [0, 5, 6], 1536), _record(1, [0, 5, 8], 1536), _record(2, [0], 100)]
    assert len(set(trace_sessions(lone, 512))) == 3  # [0,5,6] is not inside [0,5,8]


def test_trace_replay_times_regions_caps_and_file_reading(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl.gz"
    with gzip.open(path, "wt") as out:
        for r in RECORDS:
            row = {
                "timestamp": r.timestamp_ms,
                "input_length": r.input_length,
                "output_length": r.output_length,
                "hash_ids": list(r.hash_ids),
            }
            out.write(json.dumps(row) + "\n")
    records = read_trace(path)
    assert records == RECORDS
    config = TraceConfig(seed=1, speed=2.0, max_prompt_tokens=1000, max_output_tokens=5)
    requests = list(TraceWorkload(records, SHARES, config).requests())
    assert [r.at_s for r in requests][:7] == [0.0, 0.5, 1.0, 1.0, 2.5, 2.5, 2.5]
    assert max(len(r.tokens) for r in requests) == 1000
    assert {r.max_tokens for r in requests} == {5}
    by_session: dict[str, str] = {}
    for request in requests:
        region = by_session.setdefault(request.session, request.origin_region)
        assert region == request.origin_region
    again = list(TraceWorkload(records, SHARES, config).requests())
    assert [r.tokens for r in again] == [r.tokens for r in requests]
    poisson = list(TraceWorkload(records, SHARES, TraceConfig(rate=100.0)).requests())
    assert poisson[0].at_s > 0
    assert len(poisson) == len(records)


def test_readme_documents_every_synthetic_parameter() -> None:
    readme = (Path(__file__).resolve().parents[2] / "loadgen" / "README.md").read_text()
    for name, default, _ in SyntheticConfig.parameters():
        assert f"| `{name}` | `{default}` |" in readme, name
