"""Testing harness: a KVCompass pipeline on one machine (unique topics, MU and edge
processes), for the integration and chaos tests and ``bench/pipeline.py``; not used by
any service. Every instance gets its own
topic names, consumer group, Redis snapshot prefix and shared-memory prefix, so several
can share one broker and one Redis. It sees the services' state as data (their
``/healthz``, ``/readyz`` and ``/metrics`` on a port it picks), never in their logs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from kvcompass.loadgen.stack import read_metric
from kvcompass.services.infra import TopicSpec, create_topics
from kvcompass.services.kafka import KafkaLog
from kvcompass.services.snapstore import SnapshotStore
from kvcompass.shm import SharedIndexReader, remove_segments
from kvcompass.wire import PatchBatch, decode

__all__ = ["LocalCluster", "PollTimeout", "poll_until"]

T = TypeVar("T")


class PollTimeout(TimeoutError):
    """A condition polled for was not met by its deadline."""


def poll_until(
    predicate: Callable[[], T | None],
    timeout: float,
    message: str,
    interval: float = 0.01,
) -> T:
    """Poll ``predicate`` until it returns something truthy; :class:`PollTimeout` at the
    deadline (a TimeoutError, so a test reports it as a failure with the message)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise PollTimeout(f"{message} not met within {timeout:g} s (last: {value!r})")
        time.sleep(interval)


def _free_port() -> int:
    """A loopback port that was free a moment ago (a clash fails the start loudly)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalCluster:
    def __init__(
        self,
        kafka_bootstrap: str,
        redis_url: str,
        log_dir: Path,
        *,
        shards: int,
        topology: str,
        initial_capacity: int = 65_536,
        linger_ms: float = 2.0,
    ) -> None:
        """``linger_ms``: linger.ms of :attr:`producer`, which stands in for the workers'
        event producers."""
        self.kafka_bootstrap = kafka_bootstrap
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.shards = shards
        self.topology_ref = topology
        self.initial_capacity = initial_capacity
        self.tag = uuid.uuid4().hex[:8]
        self.events_topic = f"kvc.{self.tag}.events"
        self.patches_topic = f"kvc.{self.tag}.patches"
        self.dlq_topic = f"kvc.{self.tag}.dlq"
        self.queues_topic = f"kvc.{self.tag}.queues"
        self.create_topics()
        self.shm_prefix = f"kvc{self.tag}"
        self.snapshot_prefix = f"kvc:{self.tag}:snap"
        self.store = SnapshotStore(redis.Redis.from_url(redis_url), self.snapshot_prefix)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.status_ports: dict[str, int] = {}
        self.last_event_offset: dict[int, int] = {}
        self.producer = Producer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "enable.idempotence": True,
                "linger.ms": linger_ms,
                # Its lines (a test may stop the broker) go through structlog too.
                "logger": KafkaLog(),
            }
        )

    def create_topics(self) -> None:
        """Create this cluster's topics (again, after a memory broker's restart)."""
        create_topics(
            self.kafka_bootstrap,
            [
                TopicSpec(self.events_topic, self.shards),
                TopicSpec(self.patches_topic, self.shards),
                TopicSpec(self.dlq_topic, 1),
                TopicSpec(self.queues_topic, 1),
            ],
            timeout=10.0,
        )

    # -- processes ---------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "KVC_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
                "KVC_REDIS_URL": self.redis_url,
                "KVC_SHARDS": str(self.shards),
                "KVC_TOPIC_EVENTS": self.events_topic,
                "KVC_TOPIC_PATCHES": self.patches_topic,
                "KVC_TOPIC_EVENTS_DLQ": self.dlq_topic,
                "KVC_TOPIC_QUEUES": self.queues_topic,
                "KVC_TOPOLOGY": self.topology_ref,
                "KVC_SNAPSHOT_PREFIX": self.snapshot_prefix,
                "KVC_SHM_PREFIX": self.shm_prefix,
                "KVC_GROUP_ID": f"kvc-{self.tag}",
                "KVC_INITIAL_CAPACITY": str(self.initial_capacity),
            }
        )
        env.update(extra)
        return env

    def start(self, module: str, name: str, **extra: str) -> subprocess.Popen[bytes]:
        """Start ``python -m kvcompass.services.<module>`` and return once its status
        endpoint (on a free port, as KVC_METRICS_PORT) reports the ``running`` phase."""
        port = int(extra.pop("KVC_METRICS_PORT", 0)) or _free_port()
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"kvcompass.services.{module}"],
                env=self.env(KVC_METRICS_PORT=str(port), **extra),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.processes.append(proc)
        self.status_ports[name] = port

        def running() -> bool:
            if proc.poll() is not None:
                log_text = (self.log_dir / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_text}")
            return self.health(name).get("phase") == "running"

        poll_until(running, 60, f"{name} running (/healthz)")
        return proc

    def start_mu(self, name: str = "mu", **extra: str) -> subprocess.Popen[bytes]:
        """A maintenance unit, once it handles signals and runs."""
        return self.start("maintenance", name, **extra)

    def start_edge(self, name: str = "edge", **extra: str) -> subprocess.Popen[bytes]:
        return self.start("edge", name, **extra)

    # -- status, as data: the services' /healthz, /readyz and /metrics -------------------

    def health(self, name: str) -> dict[str, Any]:
        """``/healthz`` of the named service; {} while it does not answer."""
        return self._status(name, "/healthz")[1]

    def readiness(self, name: str) -> tuple[bool, dict[str, Any]]:
        """(ready, body) of ``/readyz``; (False, {}) while it does not answer."""
        code, body = self._status(name, "/readyz")
        return code == 200, body

    def wait_ready(self, name: str, timeout: float = 60.0) -> None:
        poll_until(lambda: self.readiness(name)[0], timeout, f"{name} ready (/readyz)")

    def metric(self, name: str, metric: str) -> float | None:
        """The value of an unlabelled sample of the named service's ``/metrics``."""
        return read_metric(self.status_ports[name], metric)

    def wait_assigned(self, *names: str, timeout: float = 60.0) -> None:
        """Until the named MUs together own every shard, each at least one (their
        ``kvc_mu_owned_shards`` gauges, set once a shard is restored and announced).

        Stopping a member whose group join is still pending can stall the group for
        about a minute on this broker (research/infra.md).
        """

        def assigned() -> bool:
            owned = [self.metric(n, "kvc_mu_owned_shards") or 0 for n in names]
            return all(owned) and sum(owned) >= self.shards

        poll_until(assigned, timeout, f"shards assigned to {names}")

    def _url(self, name: str, path: str) -> str:
        return f"http://127.0.0.1:{self.status_ports[name]}{path}"

    def _status(self, name: str, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self._url(name, path), timeout=2) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return 0, {}

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        proc.send_signal(sig)
        return proc.wait(timeout=60)

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        self.producer.flush(5)
        # Segments outlive a killed edge by design (readers may still map them); with
        # every process of this cluster gone, nobody will take the prefix over.
        remove_segments(self.shm_prefix)

    # -- events --------------------------------------------------------------------------

    def send(self, shard: int, data: bytes) -> None:
        """Produce one encoded event batch to its shard's partition, tracking offsets."""

        def delivered(err: object, msg: object) -> None:
            if err is not None:
                raise RuntimeError(f"event delivery failed: {err}")
            offset = msg.offset()  # type: ignore[attr-defined]
            self.last_event_offset[shard] = max(self.last_event_offset.get(shard, -1), offset)

        self.producer.produce(self.events_topic, data, partition=shard, on_delivery=delivered)

    # -- progress ----------------------------------------------------------------------

    def wait_mu_caught_up(self, timeout: float = 90.0) -> dict[int, tuple[int, int]]:
        """Until the patch stream covers every event offset produced so far.

        Returns, per shard, the (epoch, seq) of the batch that covered it last.
        """
        self.producer.flush(30)
        want = dict(self.last_event_offset)
        covered: dict[int, int] = {}
        last: dict[int, tuple[int, int]] = {}
        consumer = Consumer(
            {
                "bootstrap.servers": self.kafka_bootstrap,
                "group.id": f"kvc-watch-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,  # see ClusterSettings.fetch_wait_ms
            }
        )
        consumer.assign([TopicPartition(self.patches_topic, s, 0) for s in range(self.shards)])

        def caught_up() -> bool:
            for message in consumer.consume(500, 0.1):
                if message.error() is None:
                    batch = decode(message.value() or b"", PatchBatch)
                    covered[batch.shard] = max(covered.get(batch.shard, -1), batch.events_to)
                    last[batch.shard] = max(
                        last.get(batch.shard, (-1, -1)), (batch.epoch, batch.seq)
                    )
            return all(covered.get(s, -1) >= off for s, off in want.items())

        try:
            poll_until(caught_up, timeout, f"patches covering {want}")
        finally:
            consumer.close()
        return last

    def snapshot_positions(self, timeout: float = 60.0) -> dict[int, tuple[int, int]]:
        """(epoch, last seq) of every shard's current snapshot, once all exist."""

        def positions() -> dict[int, tuple[int, int]] | None:
            out = {}
            for shard in range(self.shards):
                vkey = self.store.current(shard)
                if vkey is None:
                    return None
                meta = self.store.load_meta(vkey)
                out[shard] = (meta.epoch, meta.next_seq - 1)
            return out

        return poll_until(positions, timeout, "snapshots of all shards")

    def edge_position(self) -> dict[int, tuple[int, int]] | None:
        """(epoch, seq) the edge has applied per shard, None until it is up."""
        try:
            reader = SharedIndexReader(self.shm_prefix)
        except FileNotFoundError:
            return None
        try:
            out = {}
            for s in range(self.shards):
                seq, epoch, ready = reader.position(s)
                if not ready:
                    return None
                out[s] = (epoch, seq)
            return out
        finally:
            reader.close()

    def wait_edge_at(self, target: dict[int, tuple[int, int]], timeout: float = 60.0) -> None:
        def reached() -> bool:
            pos = self.edge_position()
            return pos is not None and all(pos[s] >= t for s, t in target.items())

        poll_until(reached, timeout, f"edge at {target}")
