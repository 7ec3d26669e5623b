"""Usage: python -m kvcompass.services.maintenance   (settings: KVC_* environment variables)

Runs one maintenance unit until SIGTERM or SIGINT, then drains: flush patches, snapshot
every owned shard to Redis, commit the offsets the snapshots cover, leave the group.
"""

from __future__ import annotations

import sys
import threading

import structlog
from prometheus_client import CollectorRegistry

from kvcompass.errors import ConfigError, Transient
from kvcompass.services.health import Health
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
    registry = CollectorRegistry()
    serve_metrics(settings.metrics_port, registry)
    stop = threading.Event()
    stop_on_signals(stop, "kvcompass.mu")
    try:
        with MaintenanceUnit(
            settings,
            load_any_topology(settings.topology),
            kafka_bootstrap=bootstrap,
            redis_url=redis_url,
            health=Health(),
            registry=registry,
        ) as unit:
            unit.run(stop)
    except (ConfigError, Transient) as exc:
        structlog.get_logger("kvcompass.mu").error("mu_failed", error=str(exc))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
