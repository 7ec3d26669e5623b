"""One ``/metrics`` for a group of router processes (``KVC_ROUTER_PROCESSES`` > 1).

prometheus_client's multiprocess mode: every process of the group writes its metric
values to memory-mapped files named by its pid in one directory, and a scrape of any
process merges all files (counters and histograms summed, each gauge by its
``multiprocess_mode``). A process SIGKILLed keeps its files, so what it served is still
counted; :func:`forget_process` drops only its live gauges.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from prometheus_client import values
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

# prometheus_client's multiprocess module has no annotations: hence the ignores below.

__all__ = ["MULTIPROC_ENV", "GroupCollector", "forget_process", "write_to"]

#: Names the group's directory; the extras inherit it, so their prometheus_client starts
#: in multiprocess mode at import.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_RATE = "kvc_router_false_claim_rate"
_CLAIMED = "kvc_router_claimed_tokens"
_FALSE = "kvc_router_false_claimed_tokens"


def write_to(directory: str) -> None:
    """Put this process's metrics created from now on into ``directory``'s files.

    The primary reads its settings (and so learns it leads a group) after
    prometheus_client chose its value class from the environment at import; the class
    is read again by every metric constructor, so swapping it before the router's
    metrics exist is enough."""
    os.environ[MULTIPROC_ENV] = directory
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]


def forget_process(directory: str, pid: int) -> None:
    """A group member exited: its ``live*`` gauges leave the aggregate; its counters and
    histograms stay (what it served happened)."""
    mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


class GroupCollector(Collector):
    """Every group member's metrics, merged from ``directory``.

    The false-claim rate is a ratio: no merge of per-process ratios gives the group's,
    so it is recomputed from the summed token counters."""

    def __init__(self, directory: str) -> None:
        self._files = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        return list(self._merged())

    def _merged(self) -> Iterator[Metric]:
        totals: dict[str, float] = {}
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            if metric.name == _RATE:
                continue
            if metric.name in (_CLAIMED, _FALSE):
                totals[metric.name] = sum(s.value for s in metric.samples)
            yield metric
        claimed = totals.get(_CLAIMED, 0.0)
        yield GaugeMetricFamily(
            _RATE,
            "Unreused / claimed tokens since start.",
            value=totals.get(_FALSE, 0.0) / claimed if claimed else 0.0,
        )
