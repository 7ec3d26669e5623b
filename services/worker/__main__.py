"""Usage: python -m kvcompass.services.worker   (or ``kvcompass worker``; ``--help``)

Runs a worker host in the process shell (``kvcompass.services.runtime``): emulated GPU
workers, each with its own HTTP port, until SIGTERM or SIGINT.
"""

from __future__ import annotations

import sys

from kvcompass.services.runtime import ServiceSpec, run_service
from kvcompass.services.worker.host import WorkerHost
from kvcompass.services.worker.settings import WorkerSettings

SPEC = ServiceSpec(
    name="worker",
    summary=(
        "A worker host: emulated GPU workers (a two-tier prefix KV cache by blocks, an FCFS "
        "prefill queue, continuous-batching decode) behind OpenAI-compatible completions, "
        "one port per worker; publishes KV events on kvc.events and queue vectors on "
        "kvc.queues."
    ),
    settings=WorkerSettings,
    topic_fields=("topic_events", "topic_queues"),
    factory=WorkerHost,
)


def main() -> int:
    return run_service(SPEC)


if __name__ == "__main__":
    sys.exit(main())
