"""A real worker host (``python -m kvcompass.services.worker``) against the real broker:
a completion's response fields, its admit events on kvc.events (decoded), reuse on a
repeat, streaming, queue vectors on kvc.queues, reset's evicts and a clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, prefix_keys, shard_of
from kvcompass.levels import plan_levels
from kvcompass.loadgen.testing import poll_until
from kvcompass.services.infra import RunningInfra
from kvcompass.topology import load_builtin
from kvcompass.wire import EventKind, KVEventBatch, QueueVector, decode

pytestmark = pytest.mark.integration

TOPOLOGY = load_builtin("testbed-3region")
MODEL = TOPOLOGY.model.name
TIME_SCALE = 0.05  # 20x faster than real time
SHARDS = 4  # KVC_SHARDS default = the partitions of kvc.events the infra creates
START_S = 60.0  # interpreter start and imports on two busy cores


@dataclass
class Host:
    proc: subprocess.Popen[bytes]
    ports: dict[str, int]

    def url(self, worker: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[worker]}{path}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _healthy(host: Host) -> bool:
    assert host.proc.poll() is None, f"worker host exited with {host.proc.returncode}"
    try:
        with urllib.request.urlopen(host.url("eu-1", "/healthz"), timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


@pytest.fixture
def host(infra: RunningInfra, tmp_path: Any) -> Iterator[Host]:
    ports = {"eu-0": _free_port(), "eu-1": _free_port()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    env |= {
        "KVC_KAFKA_BOOTSTRAP": infra.kafka_bootstrap,
        "KVC_REDIS_URL": infra.redis_url,
        "KVC_LOG_JSON": "true",
        "KVC_WORKER_IDS": "region:eu",
        "KVC_WORKER_PORTS": ",".join(f"{w}={p}" for w, p in ports.items()),
        "KVC_TIME_SCALE": str(TIME_SCALE),
    }
    stderr = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcompass.services.worker"], env=env, stderr=stderr
    )
    started = Host(proc, ports)
    try:
        poll_until(lambda: _healthy(started), START_S, "worker host serving", 0.1)
        yield started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


class Topic:
    """Reads a topic's partitions from their current end."""

    def __init__(self, infra: RunningInfra, topic: str) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": infra.kafka_bootstrap, "group.id": uuid.uuid4().hex,
             "enable.auto.commit": False, "fetch.wait.max.ms": 20}
        )  # fmt: skip
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assigned = []
        for p in partitions:
            _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assigned.append(TopicPartition(topic, p, high))
        self.consumer.assign(assigned)
        self.decoded: list[tuple[int, Any]] = []

    def read(self) -> list[tuple[int, Any]]:
        for message in self.consumer.consume(100, 0.1):
            value, partition = message.value(), message.partition()
            if message.error() is None and value is not None and partition is not None:
                self.decoded.append((partition, decode(value)))
        return self.decoded

    def close(self) -> None:
        self.consumer.close()


def pairs_from(
    decoded: list[tuple[int, Any]], worker: str, kind: EventKind
) -> dict[tuple[int, int], tuple[Tier, int]]:
    """(length, key) → (tier, partition) of ``worker``'s events of ``kind``."""
    found = {}
    for partition, batch in decoded:
        if isinstance(batch, KVEventBatch) and batch.worker_id == worker:
            for event in batch.events:
                if event.kind is kind:
                    for pair in event.keys:
                        found[pair] = (event.tier, partition)
    return found


def test_a_completion_reports_its_reuse_and_publishes_its_prefixes(
    host: Host, infra: RunningInfra
) -> None:
    events = Topic(infra, "kvc.events")
    queues = Topic(infra, "kvc.queues")
    namespace = Namespace(MODEL, f"tenant-{uuid.uuid4().hex[:8]}")
    prompt = list(range(1000, 1600))  # 600 tokens: 37 whole blocks = 592 cacheable
    kvc = {"namespace": namespace.group, "origin_region": "us", "claimed_tokens": 0}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "kvc": kvc}
    try:
        status, first = post(host.url("eu-0", "/v1/completions"), body)
        assert status == 200, first
        assert first["object"] == "text_completion"
        assert first["usage"] == {
            "prompt_tokens": 600, "completion_tokens": 3, "total_tokens": 603,
            "prompt_tokens_details": {"cached_tokens": 0},
        }  # fmt: skip
        ext = first["kvc"]
        assert (ext["worker"], ext["region"], ext["reused_tokens"]) == ("eu-0", "eu", 0)
        assert ext["reused_tier"] == "absent"
        beta = TOPOLOGY.workers[8].beta_ms_per_token
        assert ext["timings_ms"]["prefill"] == pytest.approx(beta * 600)
        assert ext["timings_ms"]["ttft"] == pytest.approx(beta * 600, abs=1.0)
        assert ext["timings_ms"]["decode"] == pytest.approx(2 * 9.0, abs=1.0)
        assert set(ext["queues"]["queue_ms"]) == {"eu-0", "eu-1"}
        assert ext["queues"]["region"] == "eu"

        # Its admits reach kvc.events: exactly the registration lengths it now holds,
        # each key on its shard's partition.
        lengths = [c for c in plan_levels(TOPOLOGY).registration_lengths["eu"] if c <= 592]
        expected = prefix_keys(np.array(prompt, dtype=np.uint32), lengths, namespace)

        def admitted() -> dict[tuple[int, int], tuple[Tier, int]] | None:
            found = pairs_from(events.read(), "eu-0", EventKind.ADMIT)
            return found if set(expected.items()) <= set(found) else None

        found = poll_until(admitted, 10.0, "the admits on kvc.events")
        tiers = {pair: found[pair][0] for pair in expected.items()}
        assert tiers == dict.fromkeys(expected.items(), Tier.VRAM)
        for pair in expected.items():
            assert found[pair][1] == shard_of(pair[1], SHARDS)  # partition = the key's shard

        status, second = post(host.url("eu-0", "/v1/completions"), body)
        assert status == 200
        assert second["kvc"]["reused_tokens"] == 592
        assert second["kvc"]["reused_tier"] == "vram"
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 592
        assert second["kvc"]["timings_ms"]["prefill"] == pytest.approx(beta * 8)

        # The other worker of the host shares nothing with eu-0.
        status, other = post(host.url("eu-1", "/v1/completions"), body)
        assert other["kvc"]["reused_tokens"] == 0

        # The region's vector goes out on kvc.queues.
        def vector() -> QueueVector | None:
            return next(
                (v for _, v in queues.read() if isinstance(v, QueueVector) and v.region == "eu"),
                None,
            )

        sent = poll_until(vector, 10.0, "a queue vector of region eu")
        assert {w for w, _ in sent.queues} == {8, 9}
        assert sent.addressed_to("eu")

        def broadcast() -> QueueVector | None:  # every Δ the other regions get one too
            return next(
                (v for _, v in queues.read() if isinstance(v, QueueVector) and "asia" in v.to),
                None,
            )

        assert poll_until(broadcast, 10.0, "a vector of region eu addressed to asia").region == "eu"

        # Reset evicts everything it held, and says so on kvc.events.
        status, _ = post(host.url("eu-0", "/admin/reset"), {})
        assert status == 200

        def evicted() -> bool:
            return set(expected.items()) <= set(pairs_from(events.read(), "eu-0", EventKind.EVICT))

        poll_until(evicted, 10.0, "the evicts after reset")
        _, after = post(host.url("eu-0", "/v1/completions"), body)
        assert after["kvc"]["reused_tokens"] == 0
    finally:
        events.close()
        queues.close()


def test_a_stream_sends_one_chunk_per_token_then_usage_and_done(host: Host) -> None:
    body = {"model": MODEL, "prompt": [7] * 40, "max_tokens": 4, "stream": True}
    request = urllib.request.Request(
        host.url("eu-1", "/v1/completions"), json.dumps(body).encode(),
        {"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.read().decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert len(chunks) == 4
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert "usage" not in chunks[0]
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert chunks[-1]["kvc"]["worker"] == "eu-1"


def test_bad_requests_get_openai_errors_and_sigterm_stops_cleanly(host: Host) -> None:
    status, body = post(host.url("eu-0", "/v1/completions"), {"model": "gpt-4", "prompt": [1]})
    assert status == 404
    assert body["error"]["code"] == "model_not_found"
    status, body = post(host.url("eu-0", "/v1/completions"), {"model": MODEL, "prompt": []})
    assert status == 400
    assert set(body["error"]) == {"message", "type", "code"}
    host.proc.send_signal(signal.SIGTERM)
    assert host.proc.wait(timeout=30) == 0


def test_sigterm_lets_a_stream_in_flight_finish(host: Host) -> None:
    # 2,000 decode steps of 9 ms at time scale 0.05: about a second of real time.
    body = {"model": MODEL, "prompt": [3] * 40, "max_tokens": 2000, "stream": True}
    request = urllib.request.Request(
        host.url("eu-0", "/v1/completions"), json.dumps(body).encode(),
        {"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.readline().startswith(b"data: {")  # streaming has begun
        host.proc.send_signal(signal.SIGTERM)
        rest = reply.read().decode()
    chunks = [e for e in rest.split("\n\n") if e]
    assert chunks[-1] == "data: [DONE]"
    assert json.loads(chunks[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 2000
    assert host.proc.wait(timeout=30) == 0


def test_a_migration_lands_in_dram_and_is_published(host: Host, infra: RunningInfra) -> None:
    events = Topic(infra, "kvc.events")
    namespace = Namespace(MODEL, f"tenant-{uuid.uuid4().hex[:8]}")
    prompt = list(range(50_000, 50_512))
    try:
        body = {"prompt": prompt, "namespace": namespace.group, "mode": "copy", "source": "eu-0"}
        status, accepted = post(host.url("eu-1", "/v1/migrate"), body)
        assert (status, accepted["status"]) == (202, "accepted")
        lengths = [c for c in plan_levels(TOPOLOGY).registration_lengths["eu"] if c <= 512]
        expected = set(prefix_keys(np.array(prompt, dtype=np.uint32), lengths, namespace).items())

        def admitted() -> dict[tuple[int, int], tuple[Tier, int]] | None:
            found = pairs_from(events.read(), "eu-1", EventKind.ADMIT)
            return found if expected <= set(found) else None

        found = poll_until(admitted, 10.0, "the migrated prefix's admits")
        assert {found[pair][0] for pair in expected} == {Tier.DRAM}
        completion = {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                      "kvc": {"namespace": namespace.group}}  # fmt: skip
        _, reply = post(host.url("eu-1", "/v1/completions"), completion)
        assert (reply["kvc"]["reused_tokens"], reply["kvc"]["reused_tier"]) == (512, "dram")
        gamma = TOPOLOGY.gamma_ms_per_token
        assert reply["kvc"]["timings_ms"]["reload"] == pytest.approx(gamma * 512, abs=1e-3)
    finally:
        events.close()
