"""Integration fixtures: one Kafka-protocol broker and one Redis per test session.

Backends (``KVC_TEST_BACKEND``):

- ``embedded`` (default): the launcher (``kvcompass.services.infra``) starts Tansu and
  redis-server on free loopback ports, or adopts the servers named by
  ``KVC_KAFKA_BOOTSTRAP`` / ``KVC_REDIS_URL`` (e.g. the compose stack).
- ``containers``: testcontainers Kafka (KRaft) + Redis. Needs a Docker engine; without
  one every test using ``infra`` is skipped with the Docker error as the reason.

The run's summary states the backend and whether a Docker engine answers.
"""

from __future__ import annotations

import functools
import gc
import os
import re
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kvcompass.loadgen.testing import poll_until
from kvcompass.services.infra import (
    Infra,
    InfraSettings,
    RunningInfra,
    TopicSpec,
    create_topics,
)

T = TypeVar("T")

BACKENDS = ("embedded", "containers")
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"  # Apache Kafka in KRaft mode
REDIS_IMAGE = "redis:7.0"


def _backend() -> str:
    backend = os.environ.get("KVC_TEST_BACKEND", "embedded").strip().lower() or "embedded"
    if backend not in BACKENDS:
        raise pytest.UsageError(f"KVC_TEST_BACKEND={backend!r}: expected one of {BACKENDS}")
    return backend


@functools.cache
def _docker_problem() -> str | None:
    """None when a Docker engine answers, else why not (the DockerException text)."""
    import docker
    from docker.errors import DockerException

    with warnings.catch_warnings():
        # docker-py leaves the socket of a refused connection in a reference cycle; the
        # collection below frees it here, where its ResourceWarning is expected.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=5)
            try:
                client.ping()
            finally:
                client.close()
        except DockerException as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            gc.collect()
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """State the backend and the Docker engine's availability in every run's summary."""
    problem = _docker_problem()
    engine = "answers" if problem is None else f"unavailable ({problem})"
    terminalreporter.write_line(
        f"kvcompass integration backend: {_backend()}; docker engine: {engine}"
    )


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned); fail at the deadline."""
    return poll_until(predicate, timeout, message, interval)


@pytest.fixture(name="wait_for", scope="session")
def wait_for_fixture() -> Callable[..., Any]:
    """The :func:`wait_for` helper, for tests (fixtures avoid importing conftest)."""
    return wait_for


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningInfra]:
    """The session's broker and Redis with the KVCompass topics; stopped at the end."""
    settings = InfraSettings.from_env(run_dir=tmp_path_factory.mktemp("infra"))
    if _backend() == "containers":
        yield from _containers(settings)
        return
    running = Infra.start(settings)
    try:
        yield running
    finally:
        running.stop()


def _containers(settings: InfraSettings) -> Iterator[RunningInfra]:
    problem = _docker_problem()
    if problem is not None:
        pytest.skip(f"KVC_TEST_BACKEND=containers but no Docker engine answers: {problem}")
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.community.redis import RedisContainer

    with (
        KafkaContainer(KAFKA_IMAGE).with_kraft() as kafka,
        RedisContainer(REDIS_IMAGE) as redis_container,
    ):
        host = redis_container.get_container_host_ip()
        port = redis_container.get_exposed_port(redis_container.port)
        external = replace(
            settings,
            kafka_bootstrap=kafka.get_bootstrap_server(),
            redis_url=f"redis://{host}:{port}/0",
        )
        with Infra.start(external) as running:
            yield running


@pytest.fixture(scope="session")
def kafka_bootstrap(infra: RunningInfra) -> str:
    return infra.kafka_bootstrap


@pytest.fixture(scope="session")
def redis_url(infra: RunningInfra) -> str:
    return infra.redis_url


@pytest.fixture
def topic_factory(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    """``make(partitions=1)`` → a new unique topic name, created unless partitions=None.

    Create topics explicitly: Tansu auto-creates unknown topics with 4 partitions.
    """
    created: list[str] = []
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:40]

    def make(partitions: int | None = 1) -> str:
        name = f"test.{stem}.{uuid.uuid4().hex[:8]}"
        if partitions is not None:
            create_topics(kafka_bootstrap, [TopicSpec(name, partitions)], timeout=10.0)
        created.append(name)
        return name

    yield make
    _delete_topics(kafka_bootstrap, created)


def _delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete the test's topics; a name the test never used is fine."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names, operation_timeout=10).values():
        error = future.exception(timeout=10)  # not result(): see kvcompass.services.infra.topics
        if error is None:
            continue
        if (
            not isinstance(error, KafkaException)
            or error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            raise error


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A fresh run directory for a launcher of the test's own."""
    return tmp_path / "run"
