"""Faults at the edge replayer, against a real broker and Redis of each test's own (the
tests stop and kill them). Every test ends with the edge views equal to the MU's final
snapshot and to the reference model of the acknowledged events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import cast

import numpy as np
import pytest
import redis
from _edge import ThreadedEdge
from _pipeline import N_SHARDS, Cluster, prompts
from structlog.testing import capture_logs

from kvcompass.index.image import HEADER_SIZE
from kvcompass.loadgen.testing import poll_until
from kvcompass.services.infra import Infra, InfraSettings, RunningInfra
from kvcompass.services.infra.processes import ServerProcess, port_answers
from kvcompass.shm import SharedIndexReader

pytestmark = pytest.mark.integration


@pytest.fixture
def own_infra(tmp_path: Path) -> Iterator[RunningInfra]:
    """A broker and Redis for this test alone: it stops or kills them."""
    settings = InfraSettings.from_env(
        run_dir=tmp_path / "infra", kafka_bootstrap=None, redis_url=None
    )
    with Infra.start(settings) as running:
        yield running


@pytest.fixture
def cluster(own_infra: RunningInfra, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(own_infra.kafka_bootstrap, own_infra.redis_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def _server(infra: RunningInfra, name: str) -> ServerProcess:
    return next(p for p in infra.processes if p.name == name)


def _caught_up(cluster: Cluster) -> None:
    """Until the edge has applied every batch the MUs published so far."""
    cluster.wait_edge_at(cluster.wait_mu_caught_up())


def _drain_and_compare(cluster: Cluster, mus: list[Popen[bytes]]) -> None:
    """Drain the MUs (final snapshots), wait for the edge, compare everything."""
    cluster.wait_mu_caught_up()
    for proc in mus:
        assert cluster.stop(proc) == 0, "maintenance unit did not drain cleanly"
    cluster.wait_edge_at(cluster.snapshot_positions())
    assert cluster.assert_edge_matches() > 0


def _assert_reader_holds_snapshots(cluster: Cluster, reader: SharedIndexReader) -> None:
    for shard in range(N_SHARDS):
        snapshot = cluster.store.load(shard, with_keys=False)
        assert snapshot is not None
        for table, image in snapshot.views.items():
            edge = reader.image(shard, table)
            assert edge[HEADER_SIZE:] == image[HEADER_SIZE:], (shard, table)


def _images(reader: SharedIndexReader) -> dict[tuple[int, int], bytes]:
    return {
        (shard, table): reader.image(shard, table)
        for shard in range(reader.n_shards)
        for table in range(reader.n_tables)
    }


def test_redis_stopped_for_seconds_the_edge_keeps_serving_and_recovers(
    cluster: Cluster, own_infra: RunningInfra
) -> None:
    rng = np.random.default_rng(21)
    family = prompts(rng, 100)
    # No periodic MU snapshot while Redis is stopped: the fault is the edge's alone.
    mu = cluster.start_mu(KVC_SNAPSHOT_INTERVAL_S="3600")
    with capture_logs() as logs:
        edge = ThreadedEdge(cluster, KVC_SNAPSHOT_CHECK_S="0.3", KVC_REDIS_RETRY_MAX_S="1")
        edge.start()
        cluster.random_traffic(rng, 200, family)
        _caught_up(cluster)
        reader = SharedIndexReader(cluster.shm_prefix)
        before = _images(reader)
        redis_pid = _server(own_infra, "redis").pid
        os.kill(redis_pid, signal.SIGSTOP)
        try:
            # The idle edge's anti-entropy read times out: Redis is reported down ...
            poll_until(lambda: not edge.health.report()["redis"].ok, 20, "edge sees Redis down")
            # ... while the views stay ready and unchanged for readers, through retries.
            poll_until(lambda: edge.metric("kvc_edge_redis_up") == 0, 5, "redis_up metric")
            assert reader.ready()
            assert _images(reader) == before
            assert edge.error is None
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        poll_until(lambda: edge.health.report()["redis"].ok, 30, "edge sees Redis back")
        cluster.random_traffic(rng, 150, family)
        _drain_and_compare(cluster, [mu])
        reader.close()
        edge.stop()
    # Retried every second, yet one line per change of Redis's state.
    changes = [e["ok"] for e in logs if e.get("condition") == "redis"]
    assert changes == [True, False, True], changes


def test_redis_killed_and_restarted_empty_the_views_survive_untouched(
    cluster: Cluster, own_infra: RunningInfra
) -> None:
    rng = np.random.default_rng(27)
    mu = cluster.start_mu()
    cluster.random_traffic(rng, 150, prompts(rng, 100))
    with capture_logs() as logs:
        edge = ThreadedEdge(cluster, KVC_SNAPSHOT_CHECK_S="0.2", KVC_REDIS_RETRY_MAX_S="0.5")
        edge.start()
        _drain_and_compare(cluster, [mu])
        reader = SharedIndexReader(cluster.shm_prefix)
        before = _images(reader)
        redis = _server(own_infra, "redis")
        os.kill(redis.pid, signal.SIGKILL)
        poll_until(lambda: edge.metric("kvc_edge_redis_errors_total") >= 4, 30, "retries")
        assert not edge.health.report()["redis"].ok
        assert reader.ready()
        assert _images(reader) == before
        with open(cluster.log_dir / "redis-2.log", "wb") as out:
            restarted = subprocess.Popen(redis.argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            poll_until(lambda: edge.health.report()["redis"].ok, 30, "edge sees Redis back")
            # Redis came back without the snapshots: nothing to reload, nothing unlinked.
            assert reader.ready()
            assert _images(reader) == before
            reader.close()
            edge.stop()
        finally:
            restarted.terminate()
            restarted.wait(10)
    changes = [e["ok"] for e in logs if e.get("condition") == "redis"]
    assert changes == [True, False, True], changes


def test_a_foreign_writer_is_ignored_with_one_warning_and_no_resync_livelock(
    cluster: Cluster,
) -> None:
    rng = np.random.default_rng(22)
    family = prompts(rng, 100)
    mu = cluster.start_mu("mu")
    cluster.wait_assigned("mu")
    with capture_logs() as logs:
        edge = ThreadedEdge(cluster, KVC_SNAPSHOT_CHECK_S="0.5").start()
        # Same topics, another group and snapshot prefix: another writer of kvc.patches.
        foreign = cluster.start_mu(
            "foreign",
            KVC_GROUP_ID=f"foreign-{cluster.tag}",
            KVC_SNAPSHOT_PREFIX=f"kvc:{cluster.tag}:foreign",
        )
        cluster.wait_assigned("foreign")
        for _ in range(6):
            cluster.random_traffic(rng, 50, family)
            cluster.wait_mu_caught_up()
        _drain_and_compare(cluster, [mu, foreign])
        edge.stop()
    assert edge.metric("kvc_edge_foreign_batches_total") > 10
    # Resyncs come from the real MU's own takeover only, never from the foreign batches.
    assert edge.metric("kvc_edge_resyncs_total") <= N_SHARDS
    warnings = [e for e in logs if e["event"] == "foreign_patches_ignored"]
    assert len(warnings) == 1, warnings
    assert warnings[0]["owner"].startswith(f"foreign-{cluster.tag}/")


def test_a_second_edge_with_the_same_prefix_is_refused(cluster: Cluster) -> None:
    rng = np.random.default_rng(23)
    family = prompts(rng, 100)
    mu = cluster.start_mu()
    edge = cluster.start_edge("edge-1")
    cluster.random_traffic(rng, 150, family)
    _caught_up(cluster)
    with open(cluster.log_dir / "edge-2.log", "wb") as out:
        second = subprocess.Popen(
            [sys.executable, "-m", "kvcompass.services.edge"],
            env=cluster.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    assert second.wait(timeout=60) == 2  # start refused
    text = (cluster.log_dir / "edge-2.log").read_text()
    assert f"shared-memory prefix {cluster.shm_prefix!r} is in use" in text
    assert f"pid {edge.pid}" in text
    # The first edge and its readers never noticed.
    reader = SharedIndexReader(cluster.shm_prefix)
    assert reader.ready()
    reader.close()
    cluster.random_traffic(rng, 100, family)
    _drain_and_compare(cluster, [mu])
    assert cluster.stop(edge) == 0


def test_edge_killed_and_restarted_readers_never_see_the_dead_edges_views_as_ready(
    cluster: Cluster,
) -> None:
    rng = np.random.default_rng(24)
    family = prompts(rng, 100)
    mu = cluster.start_mu()
    edge = cluster.start_edge("edge-1")
    cluster.random_traffic(rng, 200, family)
    _caught_up(cluster)
    reader = SharedIndexReader(cluster.shm_prefix)  # attached before the kill
    assert reader.ready()
    cluster.stop(edge, signal.SIGKILL)
    assert not reader.ready()
    assert not any(reader.position(s)[2] for s in range(N_SHARDS))
    cluster.random_traffic(rng, 150, family)  # while no edge runs
    edge = cluster.start_edge("edge-2")
    cluster.random_traffic(rng, 100, family)
    _drain_and_compare(cluster, [mu])
    # The same reader follows the new edge to the MU's final state.
    target = cluster.snapshot_positions()
    poll_until(reader.ready, 30, "the old reader re-attached")
    assert {s: (reader.position(s)[1], reader.position(s)[0]) for s in range(N_SHARDS)} == target
    _assert_reader_holds_snapshots(cluster, reader)
    reader.close()
    assert cluster.stop(edge) == 0


def test_broker_killed_and_restarted_the_edge_goes_not_ready_then_recovers_or_exits(
    cluster: Cluster, own_infra: RunningInfra
) -> None:
    rng = np.random.default_rng(25)
    mu = cluster.start_mu()
    edge = cluster.start_edge(KVC_BROKER_TIMEOUT_S="15")
    cluster.random_traffic(rng, 150, prompts(rng, 100))
    _drain_and_compare(cluster, [mu])  # the MU drains first: the fault is the edge's alone
    reader = SharedIndexReader(cluster.shm_prefix)
    assert reader.ready()
    broker = _server(own_infra, "kafka")
    os.kill(broker.pid, signal.SIGKILL)
    killed = time.monotonic()
    poll_until(lambda: not reader.ready(), 10, "readers see the broker's loss")
    detected_s = time.monotonic() - killed
    assert detected_s < 10
    with open(cluster.log_dir / "broker-2.log", "wb") as out:
        restarted = subprocess.Popen(broker.argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        poll_until(lambda: port_answers("127.0.0.1", broker.port), 10, "broker back")
        # A memory broker comes back without its log: the edge exits non-zero for its
        # supervisor (or, finding its topic again, follows it in place and is ready).
        poll_until(lambda: edge.poll() is not None or reader.ready(), 60, "edge recovered")
        if edge.poll() is not None:
            assert edge.returncode == 3
            assert (
                "the broker came back without its log" in (cluster.log_dir / "edge.log").read_text()
            )
            assert not reader.ready()
        else:
            _assert_reader_holds_snapshots(cluster, reader)
    finally:
        restarted.terminate()
        restarted.wait(10)
        reader.close()


def test_a_corrupt_snapshot_is_refused_naming_the_part_and_retried(cluster: Cluster) -> None:
    rng = np.random.default_rng(26)
    mu = cluster.start_mu()
    cluster.random_traffic(rng, 150, prompts(rng, 100))
    _finish_without_edge(cluster, mu)
    client = redis.Redis.from_url(cluster.redis_url)
    name = f"{cluster.store.current(1)}:view:0"
    good = cast(bytes | None, client.get(name))
    assert good is not None
    client.set(name, good[:200] + bytes([good[200] ^ 1]) + good[201:])  # one flipped bit
    with capture_logs() as logs:
        edge = ThreadedEdge(cluster, KVC_BOOTSTRAP_RETRY_S="0.05").start()
        poll_until(lambda: edge.metric("kvc_edge_snapshots_refused_total") >= 3, 30, "refusals")
        assert not edge.health.report()["shards_loaded"].ok
        reader = SharedIndexReader(cluster.shm_prefix)
        assert not reader.position(1)[2]
        client.set(name, good)
        poll_until(reader.ready, 30, "the repaired snapshot loaded")
        _assert_reader_holds_snapshots(cluster, reader)
        reader.close()
        edge.stop()
    refusals = [e for e in logs if e["event"] == "snapshot_refused"]
    assert refusals
    assert all(e["shard"] == 1 and e["error"].startswith("view:0") for e in refusals), refusals
    client.close()


def _finish_without_edge(cluster: Cluster, mu: Popen[bytes]) -> None:
    cluster.wait_mu_caught_up()
    assert cluster.stop(mu) == 0
    cluster.snapshot_positions()
