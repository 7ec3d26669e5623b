"""The KVCompass policy: keys, one index lookup, the joint score over every worker."""

from __future__ import annotations

from collections.abc import Sequence

from kvcompass.frozen_init import field_builder
from kvcompass.index.reader import IndexNotReady, IndexReader
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.belief import CacheBelief
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.migration import HotPrefixTracker, MigrationOrder, MigrationPlanner
from kvcompass.routing.pending import PendingPrefixes
from kvcompass.routing.planners import Planners
from kvcompass.routing.policy import Decision, Feedback, RouteRequest, prompt_length
from kvcompass.routing.queues import QueueEstimates, QueueFed
from kvcompass.routing.score import JointScore
from kvcompass.topology import Topology

__all__ = ["KVCompassPolicy"]

#: Decisions are built valid here: made without the type call and __init__ (every field
#: given, ``lookup_ms`` 0: the index is read locally).
_new_decision = field_builder(Decision)


class KVCompassPolicy(QueueFed):
    """Routes one edge region's requests by the joint score (paper §3.4).

    Keys come from a :class:`QueryPlanner` per namespace (built on first use, kept; its
    queries chained per ``config.prefix_chain``), the matches from ``reader``; belief
    and queue estimates are updated by the feedback methods. A hot prefix family may add
    a :class:`MigrationOrder` to a decision.
    """

    name = "kvcompass"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        reader: IndexReader,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
    ) -> None:
        self.topology = topology
        self.origin_region = origin_region
        self.config = config
        self._reader = reader
        self._plan = plan
        self._clock = clock
        self._planners = Planners(plan, origin_region, config.prefix_chain)
        self.score = JointScore(
            topology,
            origin_region,
            config.ablations,
            config.lambda_max,
            config.tau_ms,
            config.remote_margin_rtt,
        )
        n = self.score.n_workers
        self.belief = CacheBelief(n, config.belief_weight)
        self.queues = QueueEstimates(topology, origin_region, clock, config.piggyback_weight)
        local = [w.index for w in topology.region(origin_region).workers]
        self._local = frozenset(local)
        self._no_match = (0,) * n
        self._top = 1 + config.fallbacks
        self._turn = 0  # rotates the start among exactly tied workers (JointScore.tie_order)
        self._migrate = config.ablations.migration
        self.hot = HotPrefixTracker(config.hot_misses, config.hot_window_s, config.max_families)
        first = {r: lengths[0] for r, lengths in plan.queries_from(origin_region).items()}
        self.migrations = MigrationPlanner(
            local,
            [first[w.region] for w in topology.workers],
            topology.index.block_size,
            config.idle_for_s,
        )
        self._family_length = first[origin_region]
        self._gamma = topology.gamma_ms_per_token
        self.pending = PendingPrefixes(config.pending_slack_s) if config.pending_credit else None
        # The lists the score reads, updated in place by their owners: looked up once.
        self._belief = self.belief.values
        self._queue_values = self.queues.values
        self._scored_queues = self._queue_values if self.score.load_aware else self.queues.blocked

    def decide(self, request: RouteRequest, explain: bool = False) -> Decision:
        prompt = prompt_length(request, self.origin_region)
        query = self._planners.query(request)
        indexed = True
        lengths: Sequence[int]
        tiers: Sequence[int]
        try:
            match = self._reader.match(query)
            lengths, tiers = match.lengths, match.tiers
        except IndexNotReady:
            lengths = tiers = self._no_match
            indexed = False
        indexed_lengths = lengths
        # The own region's (length, key) pairs, built once: credit, record, migration.
        own = query.per_region.get(self.origin_region, ()) if indexed else ()
        # Pending credit complements an index that answers (its lag); without one the
        # decision is by load alone ("no-index"), and nothing is recorded either.
        pending = self.pending if indexed else None
        if pending is not None:
            now = self._clock.monotonic()
            lengths, tiers = pending.credit(own, lengths, tiers, now)
        score = self.score
        belief = self._belief
        queues = self._scored_queues
        scores: Sequence[float]
        if explain:  # every worker ranked
            lam = score.price(queues)
            scores = score.scores(prompt, lengths, tiers, belief, queues, lam)
            order = score.rank(scores, queues, self._top, self._turn)
        else:  # the chosen worker and its fallbacks alone
            lam, scores, order = score.choose(
                prompt, lengths, tiers, belief, queues, self._top, self._turn
            )
        best = order[0]
        if not explain:
            self._turn += 1
            if pending is not None and best in self._local:
                # Only where the queue estimates are live: a remote worker's estimate is a
                # report old, and crediting it would herd more work into a stale queue.
                pending.record(best, own, now, self._queue_values[best] / 1e3)
        candidates = score.candidates(
            order,  # every worker when explaining, else choose's best _top
            prompt,
            lengths,
            tiers,
            belief,
            queues,
            lam,
            scores,
            indexed_lengths,
        )
        claimed = candidates[0].matched_tokens
        if not indexed:
            reason = "no-index"
        elif candidates[0].pending:
            reason = "reuse-pending"  # credited by what this edge sent, not by the index
        elif claimed:
            reason = "reuse-remote" if score.remote[best] else "reuse-local"
        else:
            reason = "recompute"
        migration = None
        if self._migrate and indexed and not explain:  # explaining is a dry run
            migration = self._consider_migration(own, prompt, lengths, best, scores, queues)
        return _new_decision(
            best,
            score.ids[best],
            score.regions[best],
            reason,
            claimed,
            lam,
            candidates,
            tuple(order[1 : self._top]),
            migration,
            0.0,
        )

    def _consider_migration(
        self,
        own: Sequence[tuple[int, int]],
        prompt: int,
        lengths: Sequence[int],
        best: int,
        scores: Sequence[float],
        queues: Sequence[float],
    ) -> MigrationOrder | None:
        """Count a local miss for the request's family; order a replica once it is hot."""
        if best in self._local and lengths[best]:
            return None  # served from a local cache: not a miss
        if not own or own[0][0] != self._family_length:
            return None  # shorter than the first chunk: no family
        family = own[0][1]
        if not self.hot.miss(family, self._clock.monotonic()):
            return None
        best_score = scores[best]
        order = self.migrations.plan(
            prompt,
            lengths,
            self.queues.idle_for_s,
            lambda w: scores[w] - queues[w] <= best_score,
        )
        if order is not None:
            self.hot.reset(family)
            # The target is busy loading it now (recompute: a prefill; copy: a transfer
            # we price like a reload); no other hot family should pick it too.
            w, n = order.target_worker, order.prefix_tokens
            per_token = self.score.beta[w] if order.mode == "recompute" else self._gamma
            cost = per_token * n
            self.queues.add_pending(order.target_worker, cost)
        return order

    def observe(self, feedback: Feedback) -> None:
        self.belief.update(feedback.worker, feedback.claimed_tokens, feedback.reused_tokens)
        super().observe(feedback)
