"""Usage: python -m kvcompass.services.maintenance   (or ``kvcompass mu``; ``--help``)

Runs one maintenance unit in the process shell (``kvcompass.services.runtime``) until
SIGTERM or SIGINT, then drains: flush patches, snapshot every owned shard to Redis,
commit the offsets the snapshots cover, leave the group.
"""

from __future__ import annotations

import sys

from kvcompass.services.maintenance.service import MaintenanceUnit
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.runtime import ServiceSpec, run_service

SPEC = ServiceSpec(
    name="mu",
    summary=(
        "A maintenance unit: consumes worker KV events of the shards the consumer group "
        "assigns it, applies each exactly once to the shard's index, publishes patch "
        "batches and snapshots the shards to Redis."
    ),
    settings=MaintenanceSettings,
    topic_fields=("topic_events", "topic_patches", "topic_events_dlq"),
    factory=MaintenanceUnit,
)


def main() -> int:
    return run_service(SPEC)


if __name__ == "__main__":
    sys.exit(main())
