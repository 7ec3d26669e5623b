"""Usage: python -m kvcompass.services.maintenance   (settings: KVC_* environment variables)

Runs one maintenance unit until SIGTERM or SIGINT, then drains: flush patches, snapshot
every owned shard to Redis, commit the offsets the snapshots cover, leave the group.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import structlog
from prometheus_client import start_http_server

from kvcompass import log as kvc_log
from kvcompass.services.maintenance.metrics import MaintenanceMetrics
from kvcompass.services.maintenance.service import MaintenanceUnit
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.settings import SettingsError
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology


def load_any_topology(name_or_path: str) -> Topology:
    """A built-in topology by name, else a TOML file path."""
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


def main() -> int:
    try:
        settings = MaintenanceSettings.from_env()
    except SettingsError as exc:
        print(f"kvcompass mu: {exc}", file=sys.stderr)
        return 2
    kvc_log.configure(settings.log_level, json=settings.log_json is not False)
    log = structlog.get_logger("kvcompass.mu")
    if settings.kafka_bootstrap is None or settings.redis_url is None:
        print(
            "kvcompass mu: set KVC_KAFKA_BOOTSTRAP and KVC_REDIS_URL "
            "(`kvcompass infra up` prints them)",
            file=sys.stderr,
        )
        return 2
    topology = load_any_topology(settings.topology)
    metrics = MaintenanceMetrics()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, "127.0.0.1", registry=metrics.registry)
    unit = MaintenanceUnit(
        settings,
        topology,
        kafka_bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        metrics=metrics,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if unit.stop.is_set():  # a second signal: exit now
            raise SystemExit(1)
        log.info("mu_stopping", signal=signal.Signals(signum).name)
        unit.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("mu_settings", **settings.as_dict())
    unit.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
