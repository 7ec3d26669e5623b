"""BrokerWatch with a real client and a broker of the test's own that it stops: the loss
is seen within seconds as the ``broker`` condition and one log line, and librdkafka's
own lines arrive as structured events."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from confluent_kafka import Consumer

from kvcompass.loadgen.testing import poll_until
from kvcompass.log import configure
from kvcompass.services.health import Health
from kvcompass.services.infra import Infra, InfraSettings, RunningInfra
from kvcompass.services.kafka import BrokerWatch, consumer_config

pytestmark = pytest.mark.integration


@pytest.fixture
def own_broker(run_dir: Path, infra: RunningInfra) -> Iterator[RunningInfra]:
    """A broker to stop (Redis: the session's, left alone)."""
    with Infra.start(InfraSettings(run_dir=run_dir, redis_url=infra.redis_url)) as running:
        yield running


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    configure("info", json=True, service="mu", stream=out)
    yield out
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def test_lost_broker_is_seen_within_seconds_and_logged_once(
    own_broker: RunningInfra, log_lines: io.StringIO
) -> None:
    health = Health()
    watch = BrokerWatch(health)
    consumer = Consumer(
        consumer_config(own_broker.kafka_bootstrap, "watch-test", 10, **watch.client_config())
    )
    try:
        consumer.list_topics(timeout=10)
        watch.ok()
        assert health.ready()
        own_broker.stop()
        lost_at = time.monotonic()

        def lost() -> bool:
            consumer.poll(0.1)  # serves the error callbacks and the log queue
            return not health.ready()

        poll_until(lost, 10, "broker condition not ok")
        seen_after = time.monotonic() - lost_at
        for _ in range(20):  # reconnect attempts keep failing: no further lines
            consumer.poll(0.1)
    finally:
        consumer.close()
    lines: list[dict[str, Any]] = [json.loads(x) for x in log_lines.getvalue().splitlines()]
    events = [line["event"] for line in lines]
    assert events.count("broker_reachable") == 1
    assert events.count("broker_unreachable") == 1
    assert seen_after < 10
    assert health.report()["broker"].detail.startswith(("_TRANSPORT", "_ALL_BROKERS_DOWN"))
    assert all(line["service"] == "mu" for line in lines)
    assert all(set(line) >= {"facility", "client", "text"} for line in lines
               if line["event"] == "librdkafka")  # fmt: skip
