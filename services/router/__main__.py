"""Usage: python -m kvcompass.services.router   (or ``kvcompass router``; ``--help``)

Runs one edge router in the process shell (``kvcompass.services.runtime``): the
OpenAI-compatible API on ``KVC_ROUTER_PORT`` until SIGTERM or SIGINT.
"""

from __future__ import annotations

import sys

from kvcompass.services.router.service import RouterService
from kvcompass.services.router.settings import RouterSettings
from kvcompass.services.runtime import ServiceSpec, run_service

SPEC = ServiceSpec(
    name="router",
    summary=(
        "An edge router: OpenAI-compatible /v1/completions and /v1/chat/completions; each "
        "request is decided by the routing policy over the edge's shared-memory views and "
        "forwarded to the chosen worker, whose report (reused tokens, queues) is folded "
        "back into the policy; /v1/route answers the decision alone."
    ),
    settings=RouterSettings,
    topic_fields=("topic_queues",),
    factory=RouterService,
)


def main() -> int:
    return run_service(SPEC)


if __name__ == "__main__":
    sys.exit(main())
