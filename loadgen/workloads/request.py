"""What a workload yields: one request with its arrival time, origin and prompt."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["LiveRequest", "bounded"]


@dataclass(frozen=True, slots=True, eq=False)
class LiveRequest:
    """One request of a workload, in arrival order.

    ``at_s``: seconds from the start of the run (already scaled by any speed factor);
    ``origin_region``: the region whose edge receives it; ``tenant``: the tenant name
    (the driver maps it to that tenant's API key; tenants never share KV);
    ``tokens``: the prompt's token ids (the workloads make ``array('I')``, which the
    simulator reads without converting; any sequence of ints in [0, 2^32) will do);
    ``max_tokens``: tokens to generate;
    ``session``: the conversation it belongs to; ``request_id``: unique and stable for a
    workload and seed, so records of two runs can be joined.
    """

    at_s: float
    origin_region: str
    tenant: str
    tokens: Sequence[int]
    max_tokens: int
    session: str
    request_id: str


def bounded(
    requests: Iterable[LiveRequest], duration_s: float | None = None, count: int | None = None
) -> Iterator[LiveRequest]:
    """The requests arriving before ``duration_s``, at most ``count`` of them."""
    it = iter(requests)
    if duration_s is not None:
        it = itertools.takewhile(lambda r: r.at_s < duration_s, it)
    return it if count is None else itertools.islice(it, count)
