"""One edge router process (or several sharing a port): builds the pieces from the
settings, serves until the process shell's ``stop``, then drains.

``KVC_ROUTER_PROCESSES=N`` starts N-1 more router processes (``kvcompass router`` with
the same settings, one process each; :class:`~kvcompass.services.router.group.RouterGroup`)
on the same port with SO_REUSEPORT. Each has its own policy state; they share the edge's
shared-memory views and one set of metrics (any process's ``/metrics`` shows the group's).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from types import TracebackType

import structlog
from prometheus_client import CollectorRegistry

from kvcompass.errors import ConfigError
from kvcompass.index.layout import IndexLayout
from kvcompass.index.reader import IndexReader
from kvcompass.pipeline.clock import Clock, SystemClock
from kvcompass.routing import make_policy, routing_config
from kvcompass.services.health import Health
from kvcompass.services.router import tokenizer
from kvcompass.services.router.app import RouterApp
from kvcompass.services.router.endpoints import worker_urls
from kvcompass.services.router.group import RouterGroup, primary_gone
from kvcompass.services.router.group_metrics import (
    MULTIPROC_ENV,
    GroupCollector,
    leave,
    write_to,
)
from kvcompass.services.router.policy import RoutingPolicy
from kvcompass.services.router.queues import QueueConsumer
from kvcompass.services.router.server import reuse_port_socket, serve
from kvcompass.services.router.settings import RouterSettings
from kvcompass.services.router.tenancy import Tenancy
from kvcompass.services.router.upstream import Upstream
from kvcompass.services.router.views import EdgeViews
from kvcompass.topology import Topology

__all__ = ["PolicyFactory", "RouterService", "routing_policy"]

_WATCH_S = 0.25

#: Builds the policy of one router process.
PolicyFactory = Callable[[RouterSettings, Topology, IndexReader, Clock], RoutingPolicy]


def routing_policy(
    settings: RouterSettings, topology: Topology, reader: IndexReader, clock: Clock
) -> RoutingPolicy:
    """The routing core's policy named by ``KVC_POLICY``."""
    config = routing_config(settings, pending_slack_s=settings.pending_slack_s)
    return make_policy(
        settings.policy, topology, settings.region, reader, config=config, clock=clock
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
        try:
            self._socket = reuse_port_socket(settings.router_host, settings.router_port)
        except OSError as exc:
            raise ConfigError(
                f"{settings.env_name('router_port')}={settings.router_port}: cannot listen on "
                f"{settings.router_host}:{settings.router_port} ({exc.strerror})"
            ) from None
        upstream = Upstream(
            urls,
            {w.index: w.id for w in topology.workers},
            connect_timeout_s=settings.connect_timeout_s,
            request_timeout_s=settings.request_timeout_s,
            stream_idle_timeout_s=settings.stream_idle_timeout_s,
        )
        text_tokenizer = tokenizer.load(settings.tokenizer)
        extras = settings.router_processes - 1
        self._group = RouterGroup(extras) if extras else None
        try:
            self.router = RouterApp(
                topology=topology,
                region=settings.region,
                policy=policy,
                upstream=upstream,
                tenancy=Tenancy(settings.api_keys),
                tokenizer=text_tokenizer,
                health=health,
                registry=registry,
                index=self.views,
                max_body_bytes=settings.max_body_bytes,
                metrics_registry=self._group_metrics(registry),
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
        except BaseException:
            if self._group is not None:
                self._group.remove()
            raise
        self._loop_call: Callable[..., object] | None = None
        self._watcher: asyncio.Task[None]

    def _group_metrics(self, registry: CollectorRegistry) -> CollectorRegistry | None:
        """In a group (the primary, or an extra that inherited the directory): the
        registry the metrics go to (through the group's files); ``registry``, which
        ``/metrics`` serves, gets the merge of every member's files instead."""
        if self._group is not None:
            directory = self._group.metrics_dir
            write_to(directory)
        else:
            directory = os.environ.get(MULTIPROC_ENV, "")
            if not directory:
                return None
        registry.register(GroupCollector(directory))
        return CollectorRegistry()

    def _on_queues(self, queues: object) -> None:
        """From the consumer thread: over to the loop (dropped before it runs)."""
        if self._loop_call is not None:
            self._loop_call(self.router.on_queues, queues)

    def __enter__(self) -> RouterService:
        self._consumer.start()
        if self._group is not None:
            self._group.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._group is not None:
            self._group.__exit__(exc_type, exc, tb)
        self._consumer.close()
        self.views.close()
        self._socket.close()
        # The last extra out of a group whose primary was SIGKILLed removes the
        # directory that primary cannot.
        directory = os.environ.get(MULTIPROC_ENV, "")
        extra = bool(self._settings.router_group_parent and directory)
        if extra and leave(directory, os.getpid()):
            self._log.info("router_group_metrics_removed", directory=directory)

    def run(self, stop: threading.Event) -> None:
        parent = self._settings.router_group_parent

        async def watch() -> None:
            # /readyz on either port reads Health: keep the views' condition current.
            # An extra of a group also checks that its primary still runs.
            while True:
                self.router.check_index()
                self.router.metrics.queue_ages(self._consumer.ages_s())
                if primary_gone(parent):
                    self._log.warning("router_primary_gone", primary_pid=parent)
                    stop.set()  # drain as on SIGTERM
                    return
                await asyncio.sleep(_WATCH_S)

        async def started() -> None:
            loop = asyncio.get_running_loop()
            self._loop_call = loop.call_soon_threadsafe
            self._watcher = loop.create_task(watch())
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

        if self._group is not None:
            self._group.supervise(stop)
        serve(self.router.app, self._socket, stop, started=started, stopping=stopping)
