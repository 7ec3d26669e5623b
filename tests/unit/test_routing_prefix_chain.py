"""KVCompass's prefix chain (``RoutingConfig.prefix_chain``, beyond the paper): a worker's
index hit at a length counts only where the worker also hit at the previous length its
region is queried at, since a worker holding a prefix holds every shorter one."""

from __future__ import annotations

from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import RoutingConfig
from kvcompass.routing.testing import TOY, RealIndex, kvcompass_policy, request, tokens

# TOY: region a (workers 0, 1) is queried from a at 128, 256, 512; region b (workers 2,
# 3) from a at 1008, 1504, 2000.


def holders(chain: bool, index: RealIndex, prompt_tokens: int = 2400) -> dict[str, int]:
    policy = kvcompass_policy(
        TOY, index.view, ManualClock(), RoutingConfig(prefix_chain=chain, pending_credit=False)
    )
    decision = policy.decide(request(tokens(prompt_tokens)), explain=True)
    return {c.worker_id: c.matched_tokens for c in decision.candidates if c.matched_tokens}


def test_a_hit_that_skips_a_shorter_length_counts_only_up_to_the_gap() -> None:
    """Worker 0 registered at 128 and 512 but not 256 (as a false locator at 512 looks):
    chained it is credited 128, unchained 512. Worker 2 (remote) registered at 1008 and
    2000, not 1504: chained 1008. Complete chains count in full either way."""
    index = RealIndex(TOY)
    toks = tokens(2400)
    index.set(0, toks, 128, Tier.VRAM)
    index.set(0, toks, 512, Tier.VRAM, above=256)
    index.set(1, toks, 512, Tier.VRAM)
    index.set(2, toks, 1008, Tier.DRAM)
    index.set(2, toks, 2000, Tier.DRAM, above=1504)
    index.set(3, toks, 1504, Tier.VRAM)
    assert holders(False, index) == {"a-0": 512, "a-1": 512, "b-0": 2000, "b-1": 1504}
    assert holders(True, index) == {"a-0": 128, "a-1": 512, "b-0": 1008, "b-1": 1504}


def test_a_hit_without_the_first_length_does_not_count() -> None:
    """A worker hit at 256 and 512 but not at 128: no chain starts, nothing credited."""
    index = RealIndex(TOY)
    toks = tokens(2400)
    index.set(0, toks, 512, Tier.VRAM, above=128)
    assert holders(False, index) == {"a-0": 512}
    assert holders(True, index) == {}


def test_the_chain_is_on_by_default() -> None:
    assert RoutingConfig().prefix_chain
