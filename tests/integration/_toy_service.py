"""A service for testing the process shell alone: ``python _toy_service.py``.

``TOY_BEHAVIOUR`` picks what it does: ``drain`` (stop when asked), ``hang`` (ignore
stop), ``invariant`` / ``transient`` (raise from run), ``refuse`` (raise a ConfigError
on enter), ``thread_error`` (a thread of its own fails, then it drains). Its start
checks need the broker and Redis but no topic.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter

from kvcompass.errors import ConfigError, InvariantBroken, Transient
from kvcompass.services.health import Health
from kvcompass.services.runtime import Service, ServiceSpec, run_service
from kvcompass.settings import PipelineSettings
from kvcompass.topology import Topology


class Toy:
    def __init__(self, behaviour: str, health: Health, registry: CollectorRegistry) -> None:
        self.behaviour = behaviour
        self.health = health
        self.runs = Counter("toy_runs", "Runs started.", registry=registry)

    def run(self, stop: threading.Event) -> None:
        self.runs.inc()
        self.health.set("toy", True)
        if self.behaviour == "invariant":
            raise InvariantBroken("shard 3: no seed found mid-move")
        if self.behaviour == "transient":
            raise Transient("KVC_REDIS_URL='redis://x': unreachable for 30 s")
        if self.behaviour == "hang":
            threading.Event().wait()
        if self.behaviour == "thread_error":
            worker = threading.Thread(target=self.fail, name="worker")
            worker.start()
            worker.join()
        stop.wait()

    def fail(self) -> None:
        raise RuntimeError("worker thread failed")


@contextmanager
def toy(
    settings: PipelineSettings,
    topology: Topology,
    *,
    kafka_bootstrap: str,
    redis_url: str,
    health: Health,
    registry: CollectorRegistry,
) -> Iterator[Service]:
    behaviour = os.environ["TOY_BEHAVIOUR"]
    if behaviour == "refuse":
        raise ConfigError("KVC_SHM_PREFIX='kvc': held by a live edge (pid 1)")
    yield Toy(behaviour, health, registry)


SPEC = ServiceSpec(
    name="toy", summary="A test service.", settings=PipelineSettings, topic_fields=(), factory=toy
)

if __name__ == "__main__":
    sys.exit(run_service(SPEC))
