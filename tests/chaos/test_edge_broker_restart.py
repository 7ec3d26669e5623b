"""A memory broker killed and restarted under a running edge: it comes back with an empty
log whose offsets start again from 0, below every position the edge and the snapshots
recorded. The edge must follow the new patch log in place, not reload its shards from the
snapshots again and again (updates would then arrive a snapshot interval late)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import numpy as np
import pytest
from _edge import ThreadedEdge
from _pipeline import Cluster, prompts
from confluent_kafka import Producer

from kvcompass.index.layout import Tier
from kvcompass.keys import shard_of
from kvcompass.loadgen.testing import PollTimeout, poll_until
from kvcompass.services.infra import Infra, InfraSettings, RunningInfra
from kvcompass.services.kafka import KafkaLog
from kvcompass.shm import SharedIndexReader
from kvcompass.wire import EventKind

pytestmark = pytest.mark.integration

# Four shards: a client that asks the restarted broker for a topic before the test has
# created it again gets one auto-created with 4 partitions, which is then the right count.
SHARDS = 4
SNAPSHOT_INTERVAL_S = 30.0  # the default: a reload loop shows as updates this late
OBSERVE_S = 4.0  # no reload for this long after recovery
VISIBLE_WITHIN_S = 5.0  # much less than the snapshot interval


@pytest.fixture
def own_infra(tmp_path: Path) -> Iterator[RunningInfra]:
    settings = InfraSettings.from_env(
        run_dir=tmp_path / "infra", kafka_bootstrap=None, redis_url=None
    )
    with Infra.start(settings) as running:
        yield running


def _admit_and_time(cluster: Cluster, reader: SharedIndexReader, prompt: np.ndarray) -> float:
    """Admit ``prompt`` at one worker; seconds until the edge view holds all its keys."""
    before = set(cluster.reference)
    cluster.publish(cluster.topology.workers[0].id, EventKind.ADMIT, prompt, Tier.VRAM)
    cluster.producer.flush(30)
    sent = time.monotonic()
    keys = [tk for tk in cluster.reference if tk not in before]
    assert keys

    def visible() -> bool:
        return all(
            reader.lookup(shard_of(key, SHARDS), table, key) == cluster.expected(table, key)
            for table, key in keys
        )

    poll_until(visible, 60, "the new prefix in the edge view", interval=0.02)
    return time.monotonic() - sent


@pytest.fixture
def cluster(own_infra: RunningInfra, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(own_infra.kafka_bootstrap, own_infra.redis_url, tmp_path, shards=SHARDS)
    try:
        yield c
    finally:
        c.close()


# The edge's anti-entropy period: short, a reload loop turns once per period and must not
# turn; as long as the snapshot interval, the stream alone must bring the edge along.
@pytest.mark.parametrize("check_s", [1.0, SNAPSHOT_INTERVAL_S])
def test_after_a_memory_broker_restart_the_edge_follows_the_new_log_in_place(
    own_infra: RunningInfra, cluster: Cluster, check_s: float
) -> None:
    env = {"KVC_BROKER_TIMEOUT_S": "30", "KVC_SNAPSHOT_INTERVAL_S": str(SNAPSHOT_INTERVAL_S)}
    rng = np.random.default_rng(31)
    family = prompts(rng, 60)
    mu = cluster.start_mu(**env)
    edge = ThreadedEdge(cluster, wrap_source=None, KVC_SNAPSHOT_CHECK_S=str(check_s), **env)
    edge.start()
    try:
        _restart_broker_under(own_infra, cluster, edge, mu, env, family, rng)
    finally:
        edge.stop()


def _restart_broker_under(
    own_infra: RunningInfra,
    cluster: Cluster,
    edge: ThreadedEdge,
    mu: Popen[bytes],
    env: dict[str, str],
    family: list[np.ndarray],
    rng: np.random.Generator,
) -> None:
    # Enough patch batches that the old log's offsets lie far past the new log's end.
    for _ in range(4):
        cluster.random_traffic(rng, 60, family)
        cluster.wait_edge_at(cluster.wait_mu_caught_up())
    reader = SharedIndexReader(cluster.shm_prefix)
    other = np.random.default_rng(32)  # prefixes no worker holds yet
    fresh = (other.integers(0, 60_000, 4096, dtype=np.uint32) for _ in range(40))
    assert _admit_and_time(cluster, reader, next(fresh)) < VISIBLE_WITHIN_S

    # The MU drains first: its final snapshots record offsets of the log about to be lost.
    assert cluster.stop(mu) == 0
    cluster.wait_edge_at(cluster.snapshot_positions())

    own_infra.kill("kafka")
    poll_until(lambda: edge.metric("kvc_edge_broker_up") == 0, 15, "the edge sees it")
    own_infra.restart("kafka")
    cluster.create_topics()
    # The old producer's idempotence state belongs to the lost log.
    cluster.producer = Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "logger": KafkaLog()}
    )
    cluster.last_event_offset.clear()
    # The MU's supervisor starts it again: it takes over from those snapshots with a new
    # epoch and writes its next snapshots only a snapshot interval later.
    cluster.start_mu("mu-2", **env)
    cluster.wait_ready("mu-2")
    poll_until(edge.health.ready, 60, "the edge ready again")

    # The first prefix after the restart also waits for the new epoch's one reload.
    first = _admit_and_time(cluster, reader, next(fresh))
    assert first < VISIBLE_WITHIN_S, "the edge waited for a snapshot, not the stream"
    resyncs = edge.metric("kvc_edge_resyncs_total")
    assert resyncs <= SHARDS, "at most one reload per shard (the new epoch)"
    # From now on the edge follows the live stream: each new prefix is visible within a
    # bound far below the snapshot interval, and no shard reloads again, over several
    # anti-entropy periods.
    seen = [first] + [_admit_and_time(cluster, reader, next(fresh)) for _ in range(3)]
    with pytest.raises(PollTimeout):
        poll_until(lambda: edge.metric("kvc_edge_resyncs_total") > resyncs, OBSERVE_S, "a reload")
    seen.append(_admit_and_time(cluster, reader, next(fresh)))
    assert max(seen) < VISIBLE_WITHIN_S, seen
    assert edge.metric("kvc_edge_resyncs_total") == resyncs, "shards keep reloading"
    reader.close()
