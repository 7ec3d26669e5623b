"""The compiled joint score (score.pyx) computes what its Python expressions did: the
same floats, bit for bit, and the same order, ties included.

The references below are the Python the module replaced, kept here as the
specification: a decision that changed by one ulp or one tie would change the
simulator's records and the live router's choices.
"""

from __future__ import annotations

from itertools import compress, pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.index.layout import Tier
from kvcompass.routing import Ablations
from kvcompass.routing.score import JointScore
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("sim-8region")
N = len(TOPOLOGY.workers)
_DRAM = int(Tier.DRAM)


def reference_scores(
    s: JointScore,
    prompt: int,
    lengths: list[int],
    tiers: list[int],
    belief: list[float],
    queues: list[float],
    lam: float,
) -> list[float]:
    k = 1.0 + lam
    full = k * prompt
    scores = [c + q + b * full for c, q, b in zip(s.wan, queues, s.beta, strict=True)]
    for w in compress(s.workers, lengths):
        if s.xregion_reuse or not s.remote[w]:
            e = belief[w] * lengths[w]
            scores[w] += (s.gamma * e if tiers[w] == _DRAM else 0.0) - k * s.beta[w] * e
    return scores


def reference_rank(
    s: JointScore, scores: list[float], queues: list[float], top: int, turn: int
) -> list[int]:
    order = sorted(s.tie_order(turn), key=scores.__getitem__)
    for a, b in pairwise(order[: top + 1]):
        if scores[a] == scores[b] and queues[a] != queues[b]:
            return sorted(order, key=lambda w: (scores[w], s.remote[w], queues[w]))
    return order


# Few distinct values, so that exact ties (the rank's hard part) are common.
_queue = st.sampled_from([0.0, 0.0, 12.5, 40.0, 300.0, 1e4, float("inf")])
_length = st.sampled_from([0, 0, 0, 64, 512, 4096])


@st.composite
def situations(
    draw: st.DrawFn,
) -> tuple[JointScore, int, list[int], list[int], list[float], list[float]]:
    region = draw(st.sampled_from([r.name for r in TOPOLOGY.regions]))
    ablations = Ablations(
        xregion_reuse=draw(st.booleans()), tier_aware=draw(st.booleans()), load_aware=True
    )
    margin = draw(st.sampled_from([0.0, 1.0]))
    s = JointScore(TOPOLOGY, region, ablations, 80.0, 10.0, margin)
    prompt = draw(st.integers(1, 8192))
    lengths = draw(st.lists(_length, min_size=N, max_size=N))
    tiers = draw(st.lists(st.sampled_from([1, 2]), min_size=N, max_size=N))
    belief = draw(st.lists(st.sampled_from([1.0, 0.5, 0.93]), min_size=N, max_size=N))
    queues = draw(st.lists(_queue, min_size=N, max_size=N))
    return s, prompt, lengths, tiers, belief, queues


@settings(max_examples=300, deadline=None)
@given(situations(), st.integers(0, 200), st.integers(0, 4))
def test_scores_price_and_rank_match_the_python_they_replaced(
    situation: tuple[JointScore, int, list[int], list[int], list[float], list[float]],
    turn: int,
    top: int,
) -> None:
    s, prompt, lengths, tiers, belief, queues = situation
    lam = s.price(queues)
    assert lam == min(s.lambda_max, min(queues) / s.tau_ms)
    scores = s.scores(prompt, lengths, tiers, belief, queues, lam)
    expected = reference_scores(s, prompt, lengths, tiers, belief, queues, lam)
    assert [x.hex() for x in scores] == [x.hex() for x in expected]
    assert s.rank(scores, queues, top, turn) == reference_rank(s, scores, queues, top, turn)


@settings(max_examples=300, deadline=None)
@given(situations(), st.integers(0, 200), st.integers(1, 5))
def test_choose_is_price_scores_and_the_head_of_rank(
    situation: tuple[JointScore, int, list[int], list[int], list[float], list[float]],
    turn: int,
    top: int,
) -> None:
    """A decision's one call gives what the three calls it replaces gave: the same λ,
    the same floats, and exactly the first ``top`` of the whole rank, ties included."""
    s, prompt, lengths, tiers, belief, queues = situation
    lam, scores, best = s.choose(prompt, lengths, tiers, belief, queues, top, turn)
    assert lam == s.price(queues)
    expected = reference_scores(s, prompt, lengths, tiers, belief, queues, lam)
    assert [x.hex() for x in scores] == [x.hex() for x in expected]
    assert best == reference_rank(s, expected, queues, top, turn)[:top]


def test_choose_breaks_a_head_tie_by_queue_as_rank_does() -> None:
    """Worker 1's match makes up exactly for its longer queue, so it ties with the idle
    workers and leads the tie order: by score alone it would be chosen; by queue, as
    rank() orders such a head, every idle worker goes first."""
    s = JointScore(TOPOLOGY, TOPOLOGY.regions[0].name, Ablations(), 80.0, 10.0)
    tiers, belief, prompt = [1] * N, [1.0] * N, 1000
    for matched in range(64, 64 * 64, 64):
        lengths, queues = [0] * N, [0.0] * N
        lengths[1], queues[1] = matched, s.beta[1] * matched
        scores = reference_scores(s, prompt, lengths, tiers, belief, queues, 0.0)
        if scores[1] == scores[0]:
            break
    else:
        raise AssertionError("no exact tie found")
    assert s.tie_order(1)[0] == 1
    _, _, best = s.choose(prompt, lengths, tiers, belief, queues, 2, 1)
    assert best == reference_rank(s, scores, queues, 2, 1)[:2]
    assert 1 not in best


def test_rank_breaks_a_score_tie_by_queue_only_within_the_head() -> None:
    s = JointScore(TOPOLOGY, TOPOLOGY.regions[0].name, Ablations(), 80.0, 10.0)
    scores = [5.0] * N
    queues = [float(N - w) for w in range(N)]  # the last worker has the shortest queue
    first_local = s.tie_order(0)[0]
    # The head ties on score with unequal queues: the whole order goes by queue.
    order = s.rank(scores, queues, 1, 0)
    assert order == reference_rank(s, scores, queues, 1, 0)
    assert order[0] != first_local
    assert queues[order[0]] == min(queues[w] for w in range(N) if not s.remote[w])
