"""Usage: python -m kvcompass.services.edge   (settings: KVC_* environment variables)

Bootstraps every shard's view from Redis into shared memory, then replays kvc.patches
until SIGTERM or SIGINT. Routers attach with ``kvcompass.shm.SharedIndexReader``.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from kvcompass import log as kvc_log
from kvcompass.services.edge.replayer import EdgeReplayer
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.maintenance.__main__ import load_any_topology
from kvcompass.settings import SettingsError


def main() -> int:
    try:
        settings = EdgeSettings.from_env()
    except SettingsError as exc:
        print(f"kvcompass edge: {exc}", file=sys.stderr)
        return 2
    kvc_log.configure(settings.log_level, json=settings.log_json is not False)
    log = structlog.get_logger("kvcompass.edge")
    if settings.kafka_bootstrap is None or settings.redis_url is None:
        print(
            "kvcompass edge: set KVC_KAFKA_BOOTSTRAP and KVC_REDIS_URL "
            "(`kvcompass infra up` prints them)",
            file=sys.stderr,
        )
        return 2
    registry = CollectorRegistry()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, "127.0.0.1", registry=registry)
    replayer = EdgeReplayer(
        settings,
        load_any_topology(settings.topology),
        kafka_bootstrap=settings.kafka_bootstrap,
        redis_url=settings.redis_url,
        registry=registry,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if replayer.stop.is_set():
            raise SystemExit(1)
        log.info("edge_stopping", signal=signal.Signals(signum).name)
        replayer.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("edge_settings", **settings.as_dict())
    try:
        replayer.run()
    finally:
        replayer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
