"""Replaying a block-id trace against per-region prefix caches (Fig. 2/19 and Fig. 5b).

Cache assumption: every region keeps every full block any request of that region has
prefilled, forever (an infinite cache, no eviction), so a share measured here is an
upper bound on what a real, evicting cache could find. Block ids are chained (an equal
id means an equal prefix up to that block), so a prompt's match in a region is the
number of its leading full blocks that region has seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvcompass.loadgen.workloads import TraceRecord

__all__ = ["Arrival", "SessionRegions", "replay"]


class SessionRegions(Protocol):
    """Where each session comes from (:class:`~kvcompass.loadgen.workloads.RegionShares`)."""

    @property
    def regions(self) -> tuple[str, ...]: ...

    def of_session(self, key: int, session: int) -> str: ...


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request at its arrival: where it comes from and what each region holds.

    ``matched_tokens[r]`` is the prefix of the prompt region ``r`` has cached (tokens).
    """

    index: int
    origin: str
    first_turn: bool
    prompt_tokens: int
    matched_tokens: dict[str, int]


def _leading(blocks: Sequence[int], cached: set[int]) -> int:
    n = 0
    for block in blocks:
        if block not in cached:
            break
        n += 1
    return n


def replay(
    records: Sequence[TraceRecord],
    sessions: Sequence[int],
    shares: SessionRegions,
    seed: int,
    block_size: int,
) -> Iterator[Arrival]:
    """Each record in file order, then its full blocks enter its region's cache.

    A session's region is a keyed draw over ``seed`` (follow-up turns inherit it); a
    record is a first turn when it opened its session (``sessions[i] == i``).
    """
    cached: dict[str, set[int]] = {r: set() for r in shares.regions}
    for i, record in enumerate(records):
        origin = shares.of_session(seed, sessions[i])
        full = record.hash_ids[: record.input_length // block_size]
        matched = {
            r: min(_leading(full, blocks) * block_size, record.input_length)
            for r, blocks in cached.items()
        }
        yield Arrival(i, origin, sessions[i] == i, record.input_length, matched)
        cached[origin].update(full)
