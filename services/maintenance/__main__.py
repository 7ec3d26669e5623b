"""Usage: python -m kvcompass.services.maintenance   (or ``kvcompass mu``; ``--help``)

Runs one maintenance unit in the process shell (``kvcompass.services.runtime``) until
SIGTERM or SIGINT, then drains: flush patches, snapshot every owned shard to Redis,
commit the offsets the snapshots cover, leave the group.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry

from kvcompass.services.health import Health
from kvcompass.services.maintenance.metrics import MaintenanceMetrics
from kvcompass.services.maintenance.service import MaintenanceUnit
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.runtime import Service, ServiceSpec, run_service
from kvcompass.topology import Topology


class _Running:
    """The current unit under the shell's ``run(stop)`` contract."""

    def __init__(self, unit: MaintenanceUnit) -> None:
        self._unit = unit

    def run(self, stop: threading.Event) -> None:
        self._unit.stop = stop
        self._unit.run()


@contextmanager
def _unit(
    settings: MaintenanceSettings,
    topology: Topology,
    *,
    kafka_bootstrap: str,
    redis_url: str,
    health: Health,
    registry: CollectorRegistry,
) -> Iterator[Service]:
    # Bridges the unit that takes metrics= and drains inside run(); the rewritten
    # MaintenanceUnit is itself the context manager and replaces this function.
    yield _Running(
        MaintenanceUnit(
            settings,
            topology,
            kafka_bootstrap=kafka_bootstrap,
            redis_url=redis_url,
            metrics=MaintenanceMetrics(registry),
        )
    )


SPEC = ServiceSpec(
    name="mu",
    summary=(
        "A maintenance unit: consumes worker KV events of the shards the consumer group "
        "assigns it, applies each exactly once to the shard's index, publishes patch "
        "batches and snapshots the shards to Redis."
    ),
    settings=MaintenanceSettings,
    topic_fields=("topic_events", "topic_patches", "topic_events_dlq"),
    factory=_unit,
)


def main() -> int:
    return run_service(SPEC)


if __name__ == "__main__":
    sys.exit(main())
