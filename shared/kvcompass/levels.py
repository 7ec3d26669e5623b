"""Latency-derived index levels (DESIGN §5, paper §3.2), computed offline from a topology.

Forwarding a request from edge region ``o`` to a holder in region ``r`` costs the round
trip RTT(o, r) and saves about β_r ms per matched token, so a match pays off from
n1 = RTT(o, r) / β_r tokens on: that is the first length the edge queries toward ``r``.

The paper's L equal steps stop at 3.5·n1 (about 13K tokens on ``testbed-3region``), so a
100K-token match and a 13K one look the same to the score. With ``[index]
long_context_levels`` the lengths keep doubling past the L-th up to the model's context:
a long match is then credited at least half its length, for a few more keys per admit
of a long prompt (``bench/levels.py`` reports how many).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from kvcompass.keys import DEFAULT_KEY_HASH, KeyHash
from kvcompass.topology import Topology

__all__ = ["LevelPlan", "plan_levels"]

# Slack for float noise in RTT / β (e.g. 3776.0000000001 must not round up to 3792).
_EPSILON = 1e-9


@dataclass(frozen=True)
class LevelPlan:
    """Prefix lengths each edge queries toward each region, and what workers register.

    ``query_lengths[(edge_region, target_region)]`` is ascending and block-aligned.
    ``registration_lengths[region]`` is the sorted union of the lengths any edge queries
    toward ``region``: a worker there must register its prefixes at all of them.
    ``key_hash`` is how both sides turn a prefix into its key (the topology's).
    """

    query_lengths: Mapping[tuple[str, str], tuple[int, ...]]
    registration_lengths: Mapping[str, tuple[int, ...]]
    key_hash: KeyHash = DEFAULT_KEY_HASH

    def queries_from(self, edge_region: str) -> dict[str, tuple[int, ...]]:
        """Lengths queried from ``edge_region``, by target region."""
        found = {t: lengths for (o, t), lengths in self.query_lengths.items() if o == edge_region}
        if not found:
            raise KeyError(f"unknown edge region {edge_region!r}")
        return found

    def all_query_lengths(self, edge_region: str) -> tuple[int, ...]:
        """Every length an edge in ``edge_region`` hashes a prompt at (sorted union)."""
        return tuple(sorted({c for ls in self.queries_from(edge_region).values() for c in ls}))


def plan_levels(
    topology: Topology,
    levels: int | None = None,
    local_min_tokens: int | None = None,
    *,
    long_context: bool | None = None,
) -> LevelPlan:
    """Derive every (edge region, target region) level list from ``topology``.

    Remote target: n1 + k·n1/2 for k = 0..L-1. Equal steps of n1/2 (not multiplicative
    growth) bound how much a match is under-credited when it falls to the indexed length
    below it, at every length, including the long matches that save the most (paper
    §3.2, Fig. 5b). Same region: RTT/β would be a few dozen tokens guarding almost no
    cost, so levels start at ``local_min_tokens`` (block-aligned) and double, like
    workers' chunk sizes.

    Every length is rounded up to the block size (a worker caches whole blocks); if
    rounding makes two levels coincide, the later one moves up a block so each list keeps
    exactly L distinct lengths. With ``long_context``, each list then goes on doubling
    its last length while that fits in ``topology.model.context_tokens``. ``levels``,
    ``local_min_tokens`` and ``long_context`` default to ``topology.index``.
    """
    n_levels = topology.index.levels if levels is None else levels
    local_min = topology.index.local_min_tokens if local_min_tokens is None else local_min_tokens
    if long_context is None:
        long_context = topology.index.long_context_levels
    context = topology.model.context_tokens
    if n_levels < 1:
        raise ValueError(f"levels must be at least 1, got {n_levels}")
    if local_min < 1:
        raise ValueError(f"local_min_tokens must be positive, got {local_min}")
    block = topology.index.block_size

    query: dict[tuple[str, str], tuple[int, ...]] = {}
    for origin in topology.regions:
        for target in topology.regions:
            if origin.name == target.name:
                first = _block_aligned([local_min], block)[0]  # align, then double exactly
                raw = [float(first * 2**k) for k in range(n_levels)]
            else:
                n1 = topology.rtt_ms(origin.name, target.name) / target.beta_ms_per_token
                raw = [n1 + k * n1 / 2 for k in range(n_levels)]
            lengths = _block_aligned(raw, block)
            if long_context:
                lengths += _doublings(lengths[-1], context)
            query[origin.name, target.name] = lengths

    registration = {
        r.name: tuple(sorted({c for (_, t), ls in query.items() if t == r.name for c in ls}))
        for r in topology.regions
    }
    return LevelPlan(
        MappingProxyType(query), MappingProxyType(registration), topology.index.key_hash
    )


def _doublings(last: int, limit: int) -> tuple[int, ...]:
    """2·last, 4·last, ... up to ``limit`` (block multiples, as ``last`` is one)."""
    out: list[int] = []
    c = 2 * last
    while c <= limit:
        out.append(c)
        c *= 2
    return tuple(out)


def _block_aligned(raw: Sequence[float], block: int) -> tuple[int, ...]:
    """Round each length up to a block multiple, keeping the list strictly ascending."""
    aligned: list[int] = []
    for length in raw:
        c = math.ceil(length / block - _EPSILON) * block
        aligned.append(max(c, block, aligned[-1] + block if aligned else 0))
    return tuple(aligned)
