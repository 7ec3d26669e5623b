"""A worker host: one process serving several emulated workers, each on its own port.

It runs in the process shell (``kvcompass.services.runtime``): entering it opens the
Kafka producer and binds every worker's port (a taken port is a settings error naming
the variable); :meth:`WorkerHost.run` runs one asyncio loop with a uvicorn server and an
engine driver per worker, the producer's delivery poll and the queue-vector sender, until
``stop`` is set. Then the servers stop taking requests, finish those in flight, and the
producer delivers what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import structlog
import uvicorn
from confluent_kafka import KafkaError, Message, Producer
from prometheus_client import CollectorRegistry

from kvcompass.errors import ConfigError
from kvcompass.levels import plan_levels
from kvcompass.pipeline.clock import SystemClock
from kvcompass.routing.queues import QueueReporter
from kvcompass.services.health import Health
from kvcompass.services.kafka import BrokerWatch, producer_config
from kvcompass.services.worker.api import build_app
from kvcompass.services.worker.metrics import WorkerMetrics
from kvcompass.services.worker.node import ScaledClock, WorkerNode
from kvcompass.services.worker.settings import WorkerSettings
from kvcompass.topology import Topology
from kvcompass.wire import QueueVector, encode
from kvcompass.worker import EvictionPolicy

__all__ = ["WorkerHost"]

_POLL_S = 0.05  # delivery reports and broker errors reach their callbacks this often
_STOP_CHECK_S = 0.05  # how quickly the loop notices the shell's stop event


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the process shell owns SIGTERM / SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WorkerHost:
    """The ``kvcompass worker`` service (a context manager; see the module doc)."""

    def __init__(
        self,
        settings: WorkerSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        health: Health,
        registry: CollectorRegistry,
    ) -> None:
        self.settings = settings
        self.topology = topology
        self.health = health
        self.registry = registry
        self.log = structlog.get_logger("kvcompass.worker")
        self.hosted = settings.hosted(topology)
        self._bootstrap = kafka_bootstrap
        del redis_url  # workers keep nothing in Redis (the shell still checks it at start)
        self._watch = BrokerWatch(health)
        self._producer: Producer | None = None
        self._sockets: list[socket.socket] = []
        self.clock = ScaledClock(settings.time_scale)
        self.metrics = WorkerMetrics(registry)
        self.nodes: list[WorkerNode] = []
        self._reporters: dict[str, QueueReporter] = {}
        self._seq: dict[str, int] = {}
        # Per (topic, partition): the last offset the broker acknowledged. Offsets only
        # grow in a log, so one at or below it means the broker lost the log.
        self._acked: dict[tuple[str, int], int] = {}
        self._log_lost = False

    def __enter__(self) -> WorkerHost:
        try:
            self._producer = Producer(
                producer_config(self._bootstrap, **self._watch.client_config())
            )
            self._bind()
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()
        if self._producer is not None:
            remaining = self._producer.flush(min(5.0, self.settings.drain_timeout_s))
            if remaining:
                self.log.warning("events_undelivered", batches=remaining)
            self._producer = None

    # -- start-up ----------------------------------------------------------------------

    def _bind(self) -> None:
        host = self.settings.worker_host
        for worker, port in self.hosted:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                sock.close()
                var = self.settings.env_name("worker_port_base")
                raise ConfigError(
                    f"{var}={self.settings.worker_port_base}: worker {worker.id} cannot listen "
                    f"on {host}:{port} ({exc.strerror})"
                ) from None
            # Accepted sockets inherit it: uvicorn writes a response's head and body
            # separately, and with Nagle on a keep-alive client's delayed ACK adds 40 ms.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.listen(1024)
            sock.setblocking(False)
            self._sockets.append(sock)

    def _build(self) -> None:
        plan = plan_levels(self.topology)
        policy = EvictionPolicy(self.settings.eviction_policy)
        regions = [r.name for r in self.topology.regions]
        for worker, _ in self.hosted:
            self.nodes.append(
                WorkerNode(
                    worker,
                    self.topology,
                    plan,
                    policy=policy,
                    clock=self.clock,
                    n_shards=self.settings.shards,
                    send=self._send_events,
                    metrics=self.metrics,
                )
            )
            if worker.region not in self._reporters:
                # Real time, like the edges that read the vectors.
                self._reporters[worker.region] = QueueReporter(
                    worker.region, regions, SystemClock(), self.settings.queue_broadcast_period_s
                )
                self._seq[worker.region] = 0

    # -- running -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        asyncio.run(self._main(stop))

    async def _main(self, stop: threading.Event) -> None:
        # Each node is a new incarnation with an empty cache: every shard drops what its
        # earlier runs cached (a SIGKILLed worker never sent those evictions).
        for node in self.nodes:
            node.publisher.announce()
        servers = [
            _Server(
                uvicorn.Config(
                    build_app(
                        node,
                        self.topology,
                        queues=functools.partial(self._vector_json, node.worker.region),
                        piggybacked=functools.partial(self._piggybacked, node.worker.region),
                        deliver=self._deliver,
                        health=self.health,
                        registry=self.registry,
                    ),
                    log_config=None,
                    log_level="warning",  # its per-server start lines, eight times over
                    access_log=False,
                    timeout_graceful_shutdown=max(int(self.settings.drain_timeout_s / 2), 1),
                )
            )
            for node in self.nodes
        ]
        serving = [
            asyncio.create_task(server.serve(sockets=[sock]), name=f"http-{node.worker.id}")
            for server, sock, node in zip(servers, self._sockets, self.nodes, strict=True)
        ]
        background = [asyncio.create_task(node.drive(), name=node.worker.id) for node in self.nodes]
        background += [
            asyncio.create_task(self._poll_producer(), name="producer"),
            asyncio.create_task(self._send_queues(), name="queues"),
        ]
        self.log.info(
            "workers_listening",
            workers={w.id: f"{self.settings.worker_host}:{p}" for w, p in self.hosted},
            time_scale=self.settings.time_scale,
            eviction_policy=self.settings.eviction_policy,
        )
        try:
            while not stop.is_set():
                for task in serving + background:
                    if task.done():
                        task.result()  # a crashed server or driver ends the host
                        raise RuntimeError(f"task {task.get_name()} ended")
                await asyncio.sleep(_STOP_CHECK_S)
            for server in servers:
                server.should_exit = True  # finish in-flight requests, then stop
            await asyncio.gather(*serving)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for node in self.nodes:
                node.publisher.flush()

    async def _poll_producer(self) -> None:
        producer = self._opened()
        while True:
            producer.poll(0)  # runs _acknowledged for what was delivered
            if self._log_lost:
                self._log_lost = False
                self._reannounce()
            await asyncio.sleep(_POLL_S)

    def _acknowledged(self, error: KafkaError | None, message: Message) -> None:
        """A delivery report: notes the offset, and a log the broker no longer has."""
        offset, partition = message.offset(), message.partition()
        if error is not None or offset is None or offset < 0 or partition is None:
            return
        topic = message.topic() or ""
        if topic == self.settings.topic_events:
            self.metrics.events_acked.inc()
        key = (topic, partition)
        if offset <= self._acked.get(key, -1):
            self._log_lost = True
        self._acked[key] = offset

    def _reannounce(self) -> None:
        """The broker came back without its log: events it had acknowledged are gone,
        and with them perhaps changes the index never applied. Every node tells the
        index its cache's whole state again, as a new incarnation."""
        # Offsets start over in the new log: the next deliveries on the other partitions
        # (what waited out the outage) must not count as yet another loss.
        self._acked.clear()
        sent = {node.worker.id: node.reannounce() for node in self.nodes}
        self.metrics.reannouncements.inc()
        self.log.warning("broker_log_lost_state_reannounced", prefixes=sent)

    async def _send_queues(self) -> None:
        """Each region's vector every local period; the routing core's QueueReporter
        picks the destinations (own region always, others every Δ unless piggybacked)."""
        producer = self._opened()
        while True:
            for region, reporter in self._reporters.items():
                to = reporter.destinations()
                vector = self._vector(region, to)
                producer.produce(
                    self.settings.topic_queues,
                    encode(vector),
                    partition=0,
                    on_delivery=self._acknowledged,
                )
                self.metrics.queue_vectors.labels(region).inc()
            await asyncio.sleep(self.settings.queue_local_period_s)

    # -- queue vectors -----------------------------------------------------------------

    def _vector(self, region: str, to: tuple[str, ...] = ()) -> QueueVector:
        seq = self._seq[region]
        self._seq[region] = seq + 1
        queues = tuple(
            (n.worker.index, n.queue_ms()) for n in self.nodes if n.worker.region == region
        )
        return QueueVector(region, self.clock.wall_ns(), seq, queues, to)

    def _vector_json(self, region: str) -> dict[str, Any]:
        vector = self._vector(region)
        ids = {w.index: w.id for w in self.topology.workers}
        return {
            "region": region,
            "seq": vector.seq,
            "sent_at_ns": vector.sent_at_ns,
            "queue_ms": {ids[index]: ms for index, ms in vector.queues},
        }

    def _piggybacked(self, region: str, origin: str) -> None:
        self._reporters[region].note_piggyback(origin)

    # -- events ------------------------------------------------------------------------

    def _send_events(self, shard: int, data: bytes) -> None:
        self._opened().produce(
            self.settings.topic_events, data, partition=shard, on_delivery=self._acknowledged
        )

    async def _deliver(self) -> None:
        """Wait (off the loop) until the producer delivered what it holds."""
        producer = self._opened()
        timeout = min(5.0, self.settings.drain_timeout_s)
        remaining = await asyncio.to_thread(producer.flush, timeout)
        if remaining:
            self.log.warning("events_undelivered", batches=remaining)

    def _opened(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("the worker host is not open")
        return self._producer
