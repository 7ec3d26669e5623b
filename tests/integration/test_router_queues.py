"""The router's kvc.queues consumer on the real broker: it reads the topic from the
start without a group, applies only fresh vectors addressed to its region, and keeps
following the topic."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from kvcompass.loadgen.testing import poll_until
from kvcompass.pipeline.clock import SystemClock
from kvcompass.services.health import Health
from kvcompass.services.kafka import producer_config
from kvcompass.services.router.metrics import RouterMetrics
from kvcompass.services.router.policy import RegionQueues
from kvcompass.services.router.queues import QueueConsumer
from kvcompass.wire import QueueVector, encode

pytestmark = pytest.mark.integration


def _vector(seq: int, region: str, to: tuple[str, ...] = (), age_s: float = 0.0) -> bytes:
    sent = time.time_ns() - int(age_s * 1e9)
    return encode(QueueVector(region=region, sent_at_ns=sent, seq=seq, queues=((seq, 1.5),), to=to))


def test_the_consumer_applies_fresh_vectors_addressed_to_its_region(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(2)
    producer = Producer(producer_config(kafka_bootstrap))
    backlog = [
        (0, _vector(1, "eu", age_s=600)),  # stale: an old broadcast of a long topic
        (0, _vector(2, "eu")),  # to every region
        (1, _vector(3, "asia", to=("eu",))),  # not to us
        (1, _vector(4, "asia", to=("eu", "us"))),
        (0, b"\x93not a vector"),
    ]
    for partition, value in backlog:
        producer.produce(topic, value, partition=partition)
    producer.flush(10)

    applied: list[RegionQueues] = []
    health = Health()
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    # A generous age limit: on a loaded machine the first fetch may come seconds later.
    consumer = QueueConsumer(
        bootstrap=kafka_bootstrap, topic=topic, region="us", fetch_wait_ms=20, max_age_s=30.0,
        apply=applied.append, clock=SystemClock(), health=health, metrics=metrics,
    )  # fmt: skip
    consumer.start()
    try:
        poll_until(lambda: len(applied) >= 2, 30, "the backlog's two fresh vectors for us")
        poll_until(lambda: health.report()["queues"].ok, 30, "queues ready once caught up")
        assert sorted(q.seq for q in applied) == [2, 4]
        assert {q.seq: dict(q.queue_ms) for q in applied} == {2: {2: 1.5}, 4: {4: 1.5}}

        producer.produce(topic, _vector(5, "eu", to=("us",)), partition=1)
        producer.flush(10)
        poll_until(lambda: len(applied) == 3, 30, "a vector sent after the start")
        assert applied[-1].seq == 5

        def count(outcome: str) -> float:
            value = registry.get_sample_value(
                "kvc_router_queue_vectors_total", {"outcome": outcome}
            )
            return value or 0.0

        assert (count("applied"), count("stale"), count("not_addressed"), count("bad")) == (
            3, 1, 1, 1,
        )  # fmt: skip
    finally:
        consumer.close()
