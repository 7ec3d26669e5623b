"""Faults a maintenance unit must survive, against the real broker, Redis and processes.

Each test ends as the integration tests do: the edge views equal the MU's final
snapshot byte for byte, and both answer every key the acknowledged events touched as an
independent reference model of those events does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import redis
from _pipeline import N_SHARDS, NS, Cluster, prompts
from confluent_kafka import Consumer, TopicPartition

from kvcompass.errors import InvariantBroken
from kvcompass.index.errors import IndexCorrupt
from kvcompass.index.layout import Tier
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import prefix_keys, shard_of
from kvcompass.loadgen.testing import poll_until
from kvcompass.publisher import EventPublisher
from kvcompass.services.health import Health
from kvcompass.services.infra import Infra, InfraSettings, RunningInfra
from kvcompass.services.maintenance.service import MaintenanceUnit
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.wire import DeadLetter, EventKind, PatchBatch, decode


@pytest.fixture
def cluster(infra: RunningInfra, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(infra.kafka_bootstrap, infra.redis_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def _read_topic(cluster: Cluster, topic: str, partitions: range) -> list[tuple[int, bytes]]:
    """Every record of ``topic`` as (partition, value), in order per partition; reads
    until nothing more comes for a second (the broker's end offsets are unreliable)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"chaos-reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out: list[tuple[int, bytes]] = []
    try:
        idle = 0
        while idle < 5:
            messages = [m for m in consumer.consume(500, 0.2) if m.error() is None]
            idle = 0 if messages else idle + 1
            out.extend((m.partition() or 0, m.value() or b"") for m in messages)
    finally:
        consumer.close()
    return out


def _epochs(cluster: Cluster) -> dict[int, list[int]]:
    """Per shard, the epoch of every patch batch of this cluster's MUs, in stream order."""
    out: dict[int, list[int]] = {s: [] for s in range(N_SHARDS)}
    for shard, value in _read_topic(cluster, cluster.patches_topic, range(N_SHARDS)):
        batch = decode(value, PatchBatch)
        assert batch.owner == f"kvc-{cluster.tag}/{cluster.snapshot_prefix}"
        out[shard].append(batch.epoch)
    return out


def _assert_epochs_went_up(before: dict[int, list[int]], after: dict[int, list[int]]) -> None:
    """The stream only grew, its epochs never decrease, and the next MU's are new."""
    for shard in range(N_SHARDS):
        assert after[shard][: len(before[shard])] == before[shard]
        assert after[shard] == sorted(after[shard]), f"epochs went backwards in shard {shard}"
        assert after[shard][len(before[shard])] > max(before[shard]), f"shard {shard}"


def _log(cluster: Cluster, name: str) -> str:
    return (cluster.log_dir / f"{name}.log").read_text()


def test_redis_loses_everything_then_an_mu_restarts(cluster: Cluster) -> None:
    """FLUSHALL between two MUs: the second detects the lost snapshots, rebuilds every
    shard from the event log, and still picks epochs above every earlier one (the patch
    stream remembers them); the edge converges to the acknowledged events."""
    rng = np.random.default_rng(21)
    family = prompts(rng, 100)
    edge = cluster.start_edge()
    mu = cluster.start_mu("mu-1")
    cluster.random_traffic(rng, 200, family)
    cluster.wait_mu_caught_up()
    assert cluster.stop(mu) == 0  # drained: snapshots written, offsets committed
    before = _epochs(cluster)
    redis.Redis.from_url(cluster.redis_url).flushall()
    cluster.random_traffic(rng, 150, family)
    mu = cluster.start_mu("mu-2")
    cluster.finish([mu], edge)
    _assert_epochs_went_up(before, _epochs(cluster))
    log = _log(cluster, "mu-2")
    assert log.count('"snapshot_lost"') == N_SHARDS
    assert '"events_gone"' not in log  # the log still holds everything: a full rebuild


@pytest.mark.parametrize(
    ("part", "named"),
    [("keys:0", '"reason": "keys:0: '), ("meta", '"reason": "meta: ')],
)
def test_a_corrupt_snapshot_is_refused_naming_the_part_and_rebuilt(
    cluster: Cluster, part: str, named: str
) -> None:
    """One flipped byte in shard 0's stored snapshot: the next MU refuses it with an error
    naming the part, and falls back as for a lost snapshot (a rebuild from the log)."""
    rng = np.random.default_rng(22)
    family = prompts(rng, 100)
    mu = cluster.start_mu("mu-1")
    cluster.random_traffic(rng, 200, family)
    cluster.wait_mu_caught_up()
    assert cluster.stop(mu) == 0
    before = _epochs(cluster)
    client = redis.Redis.from_url(cluster.redis_url)
    vkey = cluster.store.current(0)
    assert vkey is not None
    name = f"{vkey}:{part}"
    damaged = bytearray(cast(bytes | None, client.get(name)) or b"")
    damaged[len(damaged) // 2] ^= 0x01
    client.set(name, bytes(damaged))
    cluster.random_traffic(rng, 100, family)
    mu = cluster.start_mu("mu-2")
    cluster.wait_assigned("mu-2")  # the edge then bootstraps from the new snapshots
    edge = cluster.start_edge()
    cluster.finish([mu], edge)
    _assert_epochs_went_up(before, _epochs(cluster))
    refused = [line for line in _log(cluster, "mu-2").splitlines() if '"snapshot_refused"' in line]
    assert len(refused) == 1
    assert named in refused[0]
    assert '"shard": 0' in refused[0]
    lost = [line for line in _log(cluster, "mu-2").splitlines() if '"snapshot_lost"' in line]
    assert len(lost) == 1
    assert '"shard": 0' in lost[0]


def test_a_far_future_worker_seq_is_dead_lettered_and_the_worker_goes_on(
    cluster: Cluster,
) -> None:
    rng = np.random.default_rng(23)
    family = prompts(rng, 60)
    mu = cluster.start_mu()
    edge = cluster.start_edge()
    cluster.random_traffic(rng, 60, family)
    worker = cluster.topology.worker("us-0")
    honest = cluster.publishers[worker.id]
    captured: list[tuple[int, bytes]] = []
    rogue = EventPublisher(
        worker,
        cluster.plan,
        NS,
        N_SHARDS,
        lambda shard, data: captured.append((shard, data)),
        incarnation=honest.incarnation,
    )
    rogue.next_seq = honest.next_seq + 10**12
    stray = prompts(rng, 1)[0]
    rogue.admit(stray, Tier.VRAM)
    for shard, data in captured:
        cluster.send(shard, data)  # not in the reference: it must not be applied
    for prompt in family[:20]:  # the worker's later batches, with ordinary numbers
        cluster.publish(worker.id, EventKind.ADMIT, prompt, Tier.DRAM)
    cluster.random_traffic(rng, 60, family)
    cluster.finish([mu], edge)

    letters = [
        decode(value, DeadLetter) for _, value in _read_topic(cluster, cluster.dlq_topic, range(1))
    ]
    assert sorted(letter.payload for letter in letters) == sorted(data for _, data in captured)
    assert all("jumps more than 1000000" in letter.reason for letter in letters)
    table_id, _ = cluster.layout.slots[worker.index]
    lengths = cluster.plan.registration_lengths[worker.region]
    for key in prefix_keys(stray, lengths, NS).values():
        snapshot = cluster.store.load(shard_of(key, N_SHARDS))
        assert snapshot is not None
        tables = ShardTables.restore(snapshot, cluster.layout, snapshot.meta.shard, N_SHARDS).tables
        assert tables[table_id].get(key) == 0


class RedisServer:
    """A redis-server of the test's own, with an append-only file: a restart keeps the
    data, so stopping it is an outage and not a loss."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not on PATH"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        data_dir.mkdir(parents=True, exist_ok=True)
        self.command = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--dir",
            str(data_dir),
        ]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        try:
            poll_until(answers, 10, f"redis-server on port {self.port}")
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_redis_stops_for_seconds_and_the_mu_keeps_serving(
    infra: RunningInfra, own_redis: RedisServer, tmp_path: Path
) -> None:
    """Redis down for a while: patches keep flowing, the MU stays up and says so once,
    and snapshots covering the events of the outage are written once Redis is back."""
    cluster = Cluster(infra.kafka_bootstrap, own_redis.url, tmp_path, initial_capacity=65_536)
    try:
        rng = np.random.default_rng(24)
        family = prompts(rng, 100)
        mu = cluster.start_mu(KVC_SNAPSHOT_INTERVAL_S="0.5")
        cluster.random_traffic(rng, 100, family)
        cluster.wait_mu_caught_up()
        own_redis.stop()
        cluster.random_traffic(rng, 100, family)
        cluster.wait_mu_caught_up()  # patches cover every event published during the outage
        poll_until(lambda: '"redis_unreachable"' in _log(cluster, "mu"), 30, "outage noticed")
        assert mu.poll() is None, "the MU exited while Redis was down"
        during = dict(cluster.last_event_offset)
        own_redis.start()

        def snapshots_cover_the_outage() -> bool:
            for shard, offset in during.items():
                vkey = cluster.store.current(shard)
                if vkey is None or cluster.store.load_meta(vkey).events_offset < offset:
                    return False
            return True

        poll_until(snapshots_cover_the_outage, 60, "snapshots after the outage")
        edge = cluster.start_edge()
        cluster.finish([mu], edge)
        log = _log(cluster, "mu")
        assert log.count('"redis_unreachable"') == 1
        assert log.count('"redis_reachable"') == 1
    finally:
        cluster.close()


def _durable(cluster: Cluster) -> dict[int, tuple[int, int]]:
    """Per shard: the current snapshot's events offset and the group's committed offset."""
    consumer = Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": f"kvc-{cluster.tag}"}
    )
    try:
        committed = consumer.committed(
            [TopicPartition(cluster.events_topic, s) for s in range(N_SHARDS)], timeout=10
        )
    finally:
        consumer.close()
    out = {}
    for tp in committed:
        vkey = cluster.store.current(tp.partition)
        assert vkey is not None
        out[tp.partition] = (cluster.store.load_meta(vkey).events_offset, tp.offset)
    return out


def test_a_table_broken_mid_write_stops_the_mu_and_nothing_is_persisted(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that leaves a table corrupt (IndexCorrupt, an InvariantBroken) ends the
    unit at once: no snapshot, no offset commit, not even from the revocation that
    closing the consumer runs; the next owner restores the last good snapshot."""
    rng = np.random.default_rng(25)
    family = prompts(rng, 100)
    mu = cluster.start_mu("mu-1")
    cluster.random_traffic(rng, 150, family)
    cluster.wait_mu_caught_up()
    assert cluster.stop(mu) == 0
    cluster.random_traffic(rng, 150, family)

    at_break: dict[int, tuple[int, int]] = {}
    write_staged = ShardTables.write_staged

    def break_the_last_shard(self: ShardTables, *args: int) -> None:
        # The last shard: a unit that wrongly drained would persist the others first.
        if self.shard == N_SHARDS - 1:
            at_break.update(_durable(cluster))
            raise IndexCorrupt("no bucket seed separates a bucket's keys mid-move")
        write_staged(self, *args)

    monkeypatch.setattr(ShardTables, "write_staged", break_the_last_shard)
    settings = MaintenanceSettings.from_env(cluster.env())
    unit = MaintenanceUnit(
        settings,
        cluster.topology,
        kafka_bootstrap=cluster.kafka_bootstrap,
        redis_url=cluster.redis_url,
        health=Health(),
    )
    stop = threading.Event()
    give_up = threading.Timer(90, stop.set)  # a unit that never breaks drains instead
    give_up.start()
    try:
        with pytest.raises(InvariantBroken, match="mid-move"), unit:
            unit.run(stop)
    finally:
        give_up.cancel()
    assert at_break, "the write path never broke"
    assert _durable(cluster) == at_break
    monkeypatch.undo()
    mu = cluster.start_mu("mu-2")
    edge = cluster.start_edge()
    cluster.finish([mu], edge)


def test_broker_killed_and_restarted_the_mu_says_so_then_exits_for_its_supervisor(
    tmp_path: Path,
) -> None:
    """Broker loss is seen within seconds (readiness and one log line); a memory broker
    comes back without the event log, so the MU exits 3 instead of reading a new log
    from positions of the old one (or it exits 3 when the broker stays away)."""
    settings = InfraSettings.from_env(
        run_dir=tmp_path / "infra", kafka_bootstrap=None, redis_url=None
    )
    with Infra.start(settings) as own:
        cluster = Cluster(own.kafka_bootstrap, own.redis_url, tmp_path)
        try:
            rng = np.random.default_rng(27)
            mu = cluster.start_mu(KVC_BROKER_TIMEOUT_S="20")
            cluster.random_traffic(rng, 120, prompts(rng, 80))
            cluster.wait_mu_caught_up()
            poll_until(lambda: cluster.readiness("mu")[0], 30, "the MU is ready")
            broker = next(p for p in own.processes if p.name == "kafka")
            os.kill(broker.pid, signal.SIGKILL)
            killed = time.monotonic()
            poll_until(lambda: not cluster.readiness("mu")[0], 15, "the MU reports the loss")
            assert time.monotonic() - killed < 15
            ready, body = cluster.readiness("mu")
            assert not ready
            assert "broker" in json.dumps(body), body
            with open(tmp_path / "broker-2.log", "wb") as out:
                restarted = subprocess.Popen(broker.argv, stdout=out, stderr=subprocess.STDOUT)
            try:
                poll_until(lambda: mu.poll() is not None, 60, "the MU exits for its supervisor")
                assert mu.returncode == 3
                log_text = _log(cluster, "mu")
                assert log_text.count('"broker_unreachable"') == 1, "one line per change"
                assert (
                    "came back without its log" in log_text
                    or "the broker lost the event log" in log_text
                ), log_text[-3000:]
            finally:
                restarted.terminate()
                restarted.wait(10)
        finally:
            cluster.close()
