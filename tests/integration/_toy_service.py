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
from types import TracebackType
from typing import Self

from prometheus_client import CollectorRegistry, Counter

from kvcompass.errors import ConfigError, InvariantBroken, Transient
from kvcompass.services.health import Health
from kvcompass.services.runtime import ServiceSpec, run_service
from kvcompass.services.settings import PipelineSettings
from kvcompass.topology import Topology


class Toy:
    """Shaped like the services' contract: ``with Toy(settings, topology, ...) as toy:
    toy.run(stop)`` (mypy checks that the class itself is a ServiceFactory)."""

    def __init__(
        self,
        settings: PipelineSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        health: Health,
        registry: CollectorRegistry,
    ) -> None:
        self.behaviour = os.environ["TOY_BEHAVIOUR"]
        self.health = health
        self.runs = Counter("toy_runs", "Runs started.", registry=registry)

    def __enter__(self) -> Self:
        if self.behaviour == "refuse":
            raise ConfigError("KVC_SHM_PREFIX='kvc': held by a live edge (pid 1)")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.health.set("toy", False, "closed")

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


SPEC = ServiceSpec(
    name="toy", summary="A test service.", settings=PipelineSettings, topic_fields=(), factory=Toy
)

if __name__ == "__main__":
    sys.exit(run_service(SPEC))
