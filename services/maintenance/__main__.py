"""Usage: python -m kvcompass.services.maintenance   (settings: KVC_* environment variables)

Runs one maintenance unit until SIGTERM or SIGINT, then drains: flush patches, snapshot
every owned shard to Redis, commit the offsets the snapshots cover, leave the group.
"""

from __future__ import annotations

import sys

from kvcompass.services.maintenance.metrics import MaintenanceMetrics
from kvcompass.services.maintenance.service import MaintenanceUnit
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.runtime import (
    load_any_topology,
    serve_metrics,
    start_service,
    stop_on_signals,
)


def main() -> int:
    started = start_service(MaintenanceSettings, "kvcompass.mu")
    if started is None:
        return 2
    settings, bootstrap, redis_url = started
    metrics = MaintenanceMetrics()
    serve_metrics(settings.metrics_port, metrics.registry)
    unit = MaintenanceUnit(
        settings,
        load_any_topology(settings.topology),
        kafka_bootstrap=bootstrap,
        redis_url=redis_url,
        metrics=metrics,
    )
    stop_on_signals(unit.stop, "kvcompass.mu")
    unit.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
