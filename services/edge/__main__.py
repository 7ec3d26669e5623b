"""Usage: python -m kvcompass.services.edge   (settings: KVC_* environment variables)

Bootstraps every shard's view from Redis into shared memory, then replays kvc.patches
until SIGTERM or SIGINT. Routers attach with ``kvcompass.shm.SharedIndexReader``.
"""

from __future__ import annotations

import sys

from prometheus_client import CollectorRegistry

from kvcompass.services.edge.replayer import EdgeReplayer
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.runtime import (
    load_any_topology,
    serve_metrics,
    start_service,
    stop_on_signals,
)


def main() -> int:
    started = start_service(EdgeSettings, "kvcompass.edge")
    if started is None:
        return 2
    settings, bootstrap, redis_url = started
    registry = CollectorRegistry()
    serve_metrics(settings.metrics_port, registry)
    replayer = EdgeReplayer(
        settings,
        load_any_topology(settings.topology),
        kafka_bootstrap=bootstrap,
        redis_url=redis_url,
        registry=registry,
    )
    stop_on_signals(replayer.stop, "kvcompass.edge")
    try:
        replayer.run()
    finally:
        replayer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
