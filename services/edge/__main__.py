"""Usage: python -m kvcompass.services.edge   (or ``kvcompass edge``; ``--help``)

Runs one edge replayer in the process shell (``kvcompass.services.runtime``): bootstraps
every shard's view from Redis into shared memory, then replays kvc.patches until SIGTERM
or SIGINT. Routers attach with ``kvcompass.shm.SharedIndexReader``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry

from kvcompass.services.edge.replayer import EdgeReplayer
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.health import Health
from kvcompass.services.runtime import Service, ServiceSpec, run_service
from kvcompass.topology import Topology


class _Running:
    """The current replayer under the shell's ``run(stop)`` contract."""

    def __init__(self, replayer: EdgeReplayer) -> None:
        self._replayer = replayer

    def run(self, stop: threading.Event) -> None:
        self._replayer.stop = stop
        self._replayer.run()


@contextmanager
def _replayer(
    settings: EdgeSettings,
    topology: Topology,
    *,
    kafka_bootstrap: str,
    redis_url: str,
    health: Health,
    registry: CollectorRegistry,
) -> Iterator[Service]:
    # Bridges the replayer that needs a separate close(); the rewritten EdgeReplayer is
    # itself the context manager and replaces this function.
    replayer = EdgeReplayer(
        settings,
        topology,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        registry=registry,
    )
    try:
        yield _Running(replayer)
    finally:
        replayer.close()


SPEC = ServiceSpec(
    name="edge",
    summary=(
        "An edge replayer: loads every shard's view from its Redis snapshot into shared "
        "memory and keeps it current by replaying the patch stream; routers read the "
        "views with kvcompass.shm.SharedIndexReader."
    ),
    settings=EdgeSettings,
    topic_fields=("topic_patches",),
    factory=_replayer,
)


def main() -> int:
    return run_service(SPEC)


if __name__ == "__main__":
    sys.exit(main())
