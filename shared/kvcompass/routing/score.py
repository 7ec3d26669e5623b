"""The joint score (paper §3.4), with every per-worker constant resolved once per edge.

score(r) = WAN(o,r) + T̂q(r) + (1+λ)·β_r·(L − b_r·m_r) + γ·b_r·m_r·1[t_r = dram]

- WAN(o, r): the round trip from the edge's region to r's (the request goes there, its
  tokens come back), the same RTT that places the first remote level n1 = RTT/β_r, so
  on an idle pool a remote holder wins exactly when its match is worth the trip. With a
  remote margin m (``RoutingConfig.remote_margin_rtt``, 0 in the paper) a worker in
  another region is charged (1 + m)·RTT.
- T̂q(r): the edge's queue estimate (:mod:`kvcompass.routing.queues`).
- λ = min(λmax, min_r T̂q(r)/τ): the capacity price (see ``RoutingConfig.tau_ms``).
- β_r: worker r's prefill ms per token; b_r its cache belief; m_r, t_r its longest match
  and tier from the index.
- γ: the topology's DRAM→VRAM reload ms per token, which the topology derives as KV
  bytes per token ÷ PCIe host-to-device bandwidth (128 KiB / 50 GB/s on testbed-3region).

The per-request path is plain Python over lists: for 14-128 workers, a list
comprehension and a pass over the few holders beat numpy's per-call overhead
(measured in the module's benchmark, ``python -m kvcompass.routing.bench``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, pairwise

from kvcompass.index.layout import Tier
from kvcompass.routing.config import Ablations
from kvcompass.routing.policy import Candidate
from kvcompass.topology import Topology

__all__ = ["JointScore"]

_DRAM = int(Tier.DRAM)
_TIERS = tuple(Tier)  # by field value: cheaper than Tier(value)
#: What Candidate(...) calls once its Python __new__ has bound the arguments: half the time.
_new_candidate = tuple.__new__


class JointScore:
    """Scores all workers of a topology for requests arriving in ``origin_region``."""

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        ablations: Ablations,
        lambda_max: float,
        tau_ms: float,
        remote_margin_rtt: float = 0.0,
    ) -> None:
        workers = topology.workers
        self.n_workers = len(workers)
        self.workers = range(self.n_workers)
        self.origin_region = origin_region
        self.ids = tuple(w.id for w in workers)
        self.regions = tuple(w.region for w in workers)
        self.remote = tuple(w.region != origin_region for w in workers)
        self.wan = tuple(
            topology.rtt_ms(origin_region, w.region) * (1.0 + remote_margin_rtt * far)
            for w, far in zip(workers, self.remote, strict=True)
        )
        self.beta = tuple(w.beta_ms_per_token for w in workers)
        self.gamma = topology.gamma_ms_per_token if ablations.tier_aware else 0.0
        self.load_aware = ablations.load_aware
        self.xregion_reuse = ablations.xregion_reuse
        self.lambda_max = lambda_max
        self.tau_ms = tau_ms
        # Stable sorts over a tie order break exact score ties local region first, then
        # by a rotating start within each group (see :meth:`tie_order`).
        local = tuple(w for w in self.workers if not self.remote[w])
        remote = tuple(w for w in self.workers if self.remote[w])
        self._local_turns = _rotations(local)
        self._remote_turns = _rotations(remote)

    def price(self, queues: Sequence[float]) -> float:
        """λ = min(λmax, min_r T̂q(r) / τ); 0 without load awareness."""
        if not self.load_aware:
            return 0.0
        return min(self.lambda_max, min(queues) / self.tau_ms)

    def credited(self, worker: int, matched: int) -> int:
        """The match the score credits: remote ones count 0 without cross-region reuse."""
        return matched if self.xregion_reuse or not self.remote[worker] else 0

    def scores(
        self,
        prompt_tokens: int,
        lengths: Sequence[int],
        tiers: Sequence[int],
        belief: Sequence[float],
        queues: Sequence[float],
        lam: float,
    ) -> list[float]:
        """Every worker's score; without load awareness, ``queues`` holds only the
        failed workers' +inf (``QueueEstimates.blocked``)."""
        k = 1.0 + lam
        full = k * prompt_tokens
        scores = [c + q + b * full for c, q, b in zip(self.wan, queues, self.beta, strict=True)]
        remote, beta, gamma = self.remote, self.beta, self.gamma
        xregion = self.xregion_reuse
        for w in compress(self.workers, lengths):  # holders only, selected in C
            if xregion or not remote[w]:
                e = belief[w] * lengths[w]
                scores[w] += (gamma * e if tiers[w] == _DRAM else 0.0) - k * beta[w] * e
        return scores

    def tie_order(self, turn: int) -> tuple[int, ...]:
        """Every worker, local region first, each group rotated to start ``turn`` places on.

        Exact ties are common (every idle worker without a match scores the same) and the
        paper breaks none: always taking the lowest index piles a lightly loaded pool's
        work, and then its caches and their future hits, on the first workers of each
        region. Rotating the start per decision spreads equal workers evenly, as the
        Oracle does.
        """
        local, remote = self._local_turns, self._remote_turns
        return local[turn % len(local)] + remote[turn % len(remote)]

    def rank(
        self, scores: Sequence[float], queues: Sequence[float], top: int, turn: int = 0
    ) -> list[int]:
        """Worker indices best first (the first ``top`` at least are exactly ordered).

        Ties: local region first, then lower queue, then :meth:`tie_order` for ``turn``
        (turn 0: lower index).
        """
        order = sorted(self.tie_order(turn), key=scores.__getitem__)
        head = order[: top + 1]
        for a, b in pairwise(head):
            if scores[a] == scores[b] and queues[a] != queues[b]:
                remote = self.remote
                return sorted(order, key=lambda w: (scores[w], remote[w], queues[w]))
        return order

    def candidates(
        self,
        workers: Sequence[int],
        prompt_tokens: int,
        lengths: Sequence[int],
        tiers: Sequence[int],
        belief: Sequence[float],
        queues: Sequence[float],
        lam: float,
        scores: Sequence[float],
        indexed: Sequence[int] | None = None,
    ) -> tuple[Candidate, ...]:
        """The terms of ``workers``, in that order; ``scores`` is :meth:`scores`' list
        (each worker's entry is the sum of its terms). ``indexed``: the index's own
        lengths, where ``lengths`` may add pending credit (a longer length is pending).
        One loop, not a call per worker: the request path builds three."""
        k = 1.0 + lam
        ids, regions, wan, beta, remote = self.ids, self.regions, self.wan, self.beta, self.remote
        gamma, xregion = self.gamma, self.xregion_reuse
        out: list[Candidate] = []
        for w in workers:
            m = lengths[w]
            b = belief[w]
            if m and (xregion or not remote[w]):
                tier = _TIERS[tiers[w]]
                e = b * m
                reload = gamma * e if tier is Tier.DRAM else 0.0
            else:
                m, tier, e, reload = 0, Tier.ABSENT, 0.0, 0.0
            prefill = k * beta[w] * (prompt_tokens - e)
            pending = indexed is not None and m > indexed[w]
            terms = (
                w,
                ids[w],
                regions[w],
                wan[w],
                queues[w],
                m,
                tier,
                b,
                prefill,
                reload,
                scores[w],
                pending,
            )
            out.append(_new_candidate(Candidate, terms))
        return tuple(out)


def _rotations(workers: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``workers`` rotated to start at each of its places (one empty order if none)."""
    return tuple(workers[k:] + workers[:k] for k in range(len(workers))) or ((),)
