"""Usage: python -m kvcompass.services.edge   (or ``kvcompass edge``; ``--help``)

Runs one edge replayer in the process shell (``kvcompass.services.runtime``): bootstraps
every shard's view from Redis into shared memory, then replays kvc.patches until SIGTERM
or SIGINT. Routers attach with ``kvcompass.shm.SharedIndexReader``.
"""

from __future__ import annotations

import sys

from kvcompass.services.edge.replayer import EdgeReplayer
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.runtime import ServiceSpec, run_service

SPEC = ServiceSpec(
    name="edge",
    summary=(
        "An edge replayer: loads every shard's view from its Redis snapshot into shared "
        "memory and keeps it current by replaying the patch stream; routers read the "
        "views with kvcompass.shm.SharedIndexReader."
    ),
    settings=EdgeSettings,
    topic_fields=("topic_patches",),
    factory=EdgeReplayer,
)


def main() -> int:
    return run_service(SPEC)


if __name__ == "__main__":
    sys.exit(main())
