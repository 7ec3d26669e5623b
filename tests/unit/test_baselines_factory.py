"""Every policy name through make_policy: which need a reader, explain lists every
eligible worker without changing state, and a run repeats for a seed."""

from __future__ import annotations

import pytest

from kvcompass.errors import ConfigError
from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import NEEDS_READER, POLICY_NAMES, Feedback, make_policy
from kvcompass.routing.testing import TOY, RealIndex, StubReader, queues, request, tokens
from kvcompass.topology import load_builtin

SIM8 = load_builtin("sim-8region")


class IdleWorld:
    def queue_ms(self, worker: int) -> float:
        return 0.0


def test_policies_that_read_the_index_refuse_to_be_built_without_one() -> None:
    assert set(NEEDS_READER) < set(POLICY_NAMES)
    for name in POLICY_NAMES:
        if name in NEEDS_READER:
            with pytest.raises(ConfigError, match=f"policy '{name}' needs an index reader"):
                make_policy(name, TOY, "a")
        else:
            assert make_policy(name, TOY, "a").decide(request(tokens(300))).worker in range(4)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_explain_lists_every_eligible_worker_and_changes_nothing(name: str) -> None:
    index = RealIndex(SIM8)
    prompts = [tokens(n, seed=n) for n in (60, 700, 3000, 9000)]
    index.set(SIM8.region("de").workers[2].index, prompts[2], upto=3000, tier=Tier.DRAM)

    explained, plain = (
        make_policy(name, SIM8, "jp", index.view, clock=ManualClock(), world=IdleWorld())
        for _ in range(2)
    )
    eligible = 3 if name == "local-least-loaded" else 64
    for prompt in prompts:
        d = explained.decide(request(prompt, origin="jp"), explain=True)
        assert len({c.worker for c in d.candidates}) == eligible
        assert d.candidates[0].worker == d.worker
    # explaining changed no state: both now decide alike
    for prompt in prompts:
        a = explained.decide(request(prompt, origin="jp"))
        b = plain.decide(request(prompt, origin="jp"))
        assert (a.worker, a.reason, a.lookup_ms) == (b.worker, b.reason, b.lookup_ms)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_run_repeats_for_a_seed_on_every_edge(name: str) -> None:
    def run(seed: int) -> list[tuple[int, str, float]]:
        reader = StubReader(64)
        reader.hold(5, 2048)
        edges = {
            r.name: make_policy(name, SIM8, r.name, reader, clock=ManualClock(), seed=seed)
            for r in SIM8.regions
        }
        out = []
        for i in range(40):
            origin = SIM8.regions[i % 8].name
            p = edges[origin]
            d = p.decide(request(tokens(200 + 97 * i, seed=i % 7), origin=origin))
            p.on_forward(d, 40.0)
            if i % 3 == 0:
                p.observe(Feedback(d.worker, d.claimed_tokens, 0, queues("us", i, w1=5.0), True))
            out.append((d.worker, d.reason, d.lookup_ms))
        return out

    assert run(4) == run(4)
