"""One edge router process (or several sharing a port): builds the pieces from the
settings, serves until the process shell's ``stop``, then drains.

``KVC_ROUTER_PROCESSES=N`` starts N-1 more router processes (``kvcompass router`` with
the same settings, one process each) on the same port with SO_REUSEPORT. Each has its
own policy state and metrics; they share the edge's shared-memory views.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from types import TracebackType

import structlog
from prometheus_client import CollectorRegistry

from kvcompass.errors import ConfigError
from kvcompass.index.layout import IndexLayout
from kvcompass.index.reader import IndexReader
from kvcompass.pipeline.clock import Clock, SystemClock
from kvcompass.routing import RoutingConfig, make_policy
from kvcompass.services.health import Health
from kvcompass.services.router import tokenizer
from kvcompass.services.router.app import RouterApp
from kvcompass.services.router.endpoints import worker_urls
from kvcompass.services.router.policy import RoutingPolicy
from kvcompass.services.router.queues import QueueConsumer
from kvcompass.services.router.server import reuse_port_socket, serve
from kvcompass.services.router.settings import RouterSettings
from kvcompass.services.router.tenancy import Tenancy
from kvcompass.services.router.upstream import Upstream
from kvcompass.services.router.views import EdgeViews
from kvcompass.topology import Topology

__all__ = ["PolicyFactory", "RouterService", "routing_policy"]

_VIEWS_CHECK_S = 0.25

#: Builds the policy of one router process.
PolicyFactory = Callable[[RouterSettings, Topology, IndexReader, Clock], RoutingPolicy]


def routing_policy(
    settings: RouterSettings, topology: Topology, reader: IndexReader, clock: Clock
) -> RoutingPolicy:
    """The routing core's policy named by ``KVC_POLICY``."""
    return make_policy(
        settings.policy, topology, settings.region, reader, config=RoutingConfig(), clock=clock
    )


class RouterService:
    """The router as a service of the process shell (``run_service``)."""

    def __init__(
        self,
        settings: RouterSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        health: Health,
        registry: CollectorRegistry,
        policy_factory: PolicyFactory = routing_policy,
        clock: Clock | None = None,
    ) -> None:
        del redis_url  # the router reads the views from shared memory, not Redis
        if settings.region not in {r.name for r in topology.regions}:
            raise settings.invalid("region", "is not a region of the topology")
        self._settings = settings
        self._log = structlog.get_logger("kvcompass.router")
        clock = clock or SystemClock()
        urls = worker_urls(settings.worker_endpoints, topology)
        self.views = EdgeViews(
            settings.shm_prefix, IndexLayout.from_topology(topology), settings.index_stale_s
        )
        health.set("views", False, "not checked yet")
        # Without the broker the queue vectors stop (routing by piggybacked and pending
        # estimates): reported on /readyz, but the router still serves.
        health.advise("broker")
        policy = policy_factory(settings, topology, self.views, clock)
        self.router = RouterApp(
            topology=topology,
            region=settings.region,
            policy=policy,
            upstream=Upstream(
                urls,
                {w.index: w.id for w in topology.workers},
                connect_timeout_s=settings.connect_timeout_s,
                request_timeout_s=settings.request_timeout_s,
                stream_idle_timeout_s=settings.stream_idle_timeout_s,
            ),
            tenancy=Tenancy(settings.api_keys),
            tokenizer=tokenizer.load(settings.tokenizer),
            health=health,
            registry=registry,
            index=self.views,
            max_body_bytes=settings.max_body_bytes,
        )
        self._consumer = QueueConsumer(
            bootstrap=kafka_bootstrap,
            topic=settings.topic_queues,
            region=settings.region,
            fetch_wait_ms=settings.fetch_wait_ms,
            max_age_s=settings.queue_max_age_s,
            apply=self._on_queues,
            clock=clock,
            health=health,
            metrics=self.router.metrics,
        )
        self._loop_call: Callable[..., object] | None = None
        self._watcher: asyncio.Task[None]
        try:
            self._socket = reuse_port_socket(settings.router_host, settings.router_port)
        except OSError as exc:
            raise ConfigError(
                f"{settings.env_name('router_port')}={settings.router_port}: cannot listen on "
                f"{settings.router_host}:{settings.router_port} ({exc.strerror})"
            ) from None
        self._children: list[subprocess.Popen[bytes]] = []

    def _on_queues(self, queues: object) -> None:
        """From the consumer thread: over to the loop (dropped before it runs)."""
        if self._loop_call is not None:
            self._loop_call(self.router.on_queues, queues)

    def __enter__(self) -> RouterService:
        self._consumer.start()
        env = {**os.environ, "KVC_ROUTER_PROCESSES": "1", "KVC_METRICS_PORT": "0"}
        for _ in range(self._settings.router_processes - 1):
            self._children.append(
                subprocess.Popen([sys.executable, "-m", "kvcompass.services.router"], env=env)
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for child in self._children:
            if child.poll() is None:
                child.terminate()
        for child in self._children:
            child.wait()
        self._consumer.close()
        self.views.close()
        self._socket.close()

    def run(self, stop: threading.Event) -> None:
        async def watch_views() -> None:
            # /readyz on either port reads Health: keep the views' condition current.
            while True:
                self.router.check_index()
                await asyncio.sleep(_VIEWS_CHECK_S)

        async def started() -> None:
            loop = asyncio.get_running_loop()
            self._loop_call = loop.call_soon_threadsafe
            self._watcher = loop.create_task(watch_views())
            self._log.info(
                "listening",
                host=self._settings.router_host,
                port=self._settings.router_port,
                policy=self.router.policy.name,
                processes=self._settings.router_processes,
            )

        async def stopping() -> None:
            self._loop_call = None
            self._watcher.cancel()

        serve(self.router.app, self._socket, stop, started=started, stopping=stopping)
