"""One ``/metrics`` for a group of router processes (``KVC_ROUTER_PROCESSES`` > 1).

prometheus_client's multiprocess mode: every process of the group writes its metric
values to memory-mapped files named by its pid in one directory, and a scrape of any
process merges all files (counters and histograms summed, each gauge by its
``multiprocess_mode``). A process SIGKILLed keeps its files, so what it served is still
counted; :func:`forget_process` drops only its live gauges. The primary removes the
directory when the group ends; after a SIGKILLed primary the last extra to
:func:`leave` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Iterable, Iterator

from prometheus_client import values
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from kvcompass.services.infra.processes import is_running

# prometheus_client's multiprocess module has no annotations: hence the ignores below.

__all__ = ["MULTIPROC_ENV", "GroupCollector", "forget_process", "leave", "write_to"]

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


def leave(directory: str, me: int) -> bool:
    """Extra ``me`` leaves the group; if no other member still runs (the primary was
    SIGKILLed, or has ended), remove the directory. Returns whether it did.

    Members are the pids that own files; one that already left counts as gone even while
    it exits, and a lock orders the leavers, so of extras that drain together exactly
    the last removes it."""
    with contextlib.suppress(FileNotFoundError):  # the primary removed it already
        lock = os.open(os.path.join(directory, ".lock"), os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            open(os.path.join(directory, f"left_{me}"), "w").close()
            names = os.listdir(directory)
            left = {int(m[1]) for n in names if (m := _LEFT.fullmatch(n))}
            members = {int(m[1]) for n in names if (m := _FILE.fullmatch(n))}
            if any(is_running(pid) for pid in members - left):
                return False
            shutil.rmtree(directory, ignore_errors=True)
            return True
        finally:
            os.close(lock)
    return False


_FILE = re.compile(r".+_(\d+)\.db")  # prometheus_client's "<kind>_<pid>.db"
_LEFT = re.compile(r"left_(\d+)")


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
