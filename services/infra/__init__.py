"""Local infrastructure: the embedded Kafka-protocol broker and Redis, and the topics.

Usage: kvcompass infra up|status|down [--json]   (or python -m kvcompass.services.infra)

Library use (tests, demo)::

    with Infra.start(InfraSettings.from_env()) as infra:
        infra.kafka_bootstrap, infra.redis_url
"""

from kvcompass.services.infra.errors import (
    AlreadyRunning,
    InfraError,
    ServerStartError,
    StateFileError,
    TopicError,
    TopicPartitionMismatch,
)
from kvcompass.services.infra.launcher import (
    Infra,
    InfraStatus,
    RunningInfra,
    ServiceStatus,
    StopResult,
)
from kvcompass.services.infra.settings import InfraSettings
from kvcompass.services.infra.state import InfraState
from kvcompass.services.infra.topics import TopicSpec, create_topics, ensure_topics, topic_specs

__all__ = [
    "AlreadyRunning",
    "Infra",
    "InfraError",
    "InfraSettings",
    "InfraState",
    "InfraStatus",
    "RunningInfra",
    "ServerStartError",
    "ServiceStatus",
    "StateFileError",
    "StopResult",
    "TopicError",
    "TopicPartitionMismatch",
    "TopicSpec",
    "create_topics",
    "ensure_topics",
    "topic_specs",
]
