"""The event-sourced pipeline end to end, against the real broker and Redis.

Workers' events go to kvc.events; maintenance units (real processes) apply them and
publish patches; an edge replayer (a real process) keeps shared-memory views. Every test
ends by checking that the edge views equal the maintenance unit's final snapshot byte
for byte and that both answer every key the events touched as an independent reference
model of the same events does.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _edge import ThreadedEdge
from _pipeline import N_SHARDS, NS, Cluster, prompts
from confluent_kafka import Consumer, Message, TopicPartition

from kvcompass.index.discovery import MultiLevelQuery
from kvcompass.index.layout import Tier
from kvcompass.loadgen.testing import poll_until
from kvcompass.pipeline import Faults, FaultySource
from kvcompass.services.edge.replayer import Poll
from kvcompass.services.infra import RunningInfra
from kvcompass.shm import SharedIndexReader
from kvcompass.wire import DeadLetter, EventKind, decode

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(infra: RunningInfra, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(infra.kafka_bootstrap, infra.redis_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_publishers_to_edge_views(cluster: Cluster) -> None:
    rng = np.random.default_rng(11)
    mu = cluster.start_mu()
    edge = cluster.start_edge()
    cluster.random_traffic(rng, 600, prompts(rng, 150))
    checked = cluster.finish([mu], edge)
    assert checked == len(cluster.reference) > 800


@pytest.mark.parametrize("kill_after", [(120, 300), (40, 500)])
def test_mu_killed_mid_stream_loses_nothing_and_applies_nothing_twice(
    cluster: Cluster, kill_after: tuple[int, int]
) -> None:
    """Each MU is SIGKILLed past its last snapshot, so the next owner re-reads what it
    applied; and every batch of the first phase arrives again (the same bytes, as an
    at-least-once sender re-sends them), after later batches of the same workers and in
    reverse order. Applied twice, those copies would put older tiers over newer ones, so
    the views match the reference only if every copy is dropped."""
    rng = np.random.default_rng(kill_after[0])
    family = prompts(rng, 120)
    edge = cluster.start_edge()
    mu = cluster.start_mu("mu-1")
    cluster.random_traffic(rng, kill_after[0], family)
    first_phase = list(cluster.sent)
    cluster.stop(mu, signal.SIGKILL)
    mu = cluster.start_mu("mu-2")
    cluster.random_traffic(rng, kill_after[1], family)
    cluster.stop(mu, signal.SIGKILL)
    cluster.redeliver(first_phase[::-1])
    cluster.random_traffic(rng, 100, family)  # published while no MU runs
    mu = cluster.start_mu("mu-3")
    cluster.finish([mu], edge)


def test_second_mu_takes_over_when_one_leaves(cluster: Cluster) -> None:
    rng = np.random.default_rng(5)
    family = prompts(rng, 120)
    edge = cluster.start_edge()
    first = cluster.start_mu("mu-a")
    second = cluster.start_mu("mu-b")
    cluster.wait_assigned("mu-a", "mu-b")
    cluster.random_traffic(rng, 300, family)
    assert cluster.stop(first) == 0  # leaves the group; its shards move to mu-b
    cluster.random_traffic(rng, 300, family)
    cluster.finish([second], edge)


def test_edge_restart_bootstraps_from_redis_and_catches_up(cluster: Cluster) -> None:
    rng = np.random.default_rng(8)
    family = prompts(rng, 120)
    mu = cluster.start_mu()
    edge = cluster.start_edge("edge-1")
    cluster.random_traffic(rng, 250, family)
    cluster.stop(edge, signal.SIGKILL)
    cluster.random_traffic(rng, 250, family)
    edge = cluster.start_edge("edge-2")
    cluster.random_traffic(rng, 100, family)
    cluster.finish([mu], edge)


def test_faulty_patch_stream_triggers_resync(cluster: Cluster) -> None:
    rng = np.random.default_rng(3)
    mu = cluster.start_mu(KVC_SNAPSHOT_INTERVAL_S="1")
    faults = Faults(drop=0.05, duplicate=0.1, reorder=0.05, delay=0.05)
    sources: list[FaultySource[Message]] = []

    def faulty(poll: Poll) -> Poll:
        sources.append(FaultySource(poll, faults, seed=3))
        return sources[-1]

    edge = ThreadedEdge(cluster, wrap_source=faulty).start()
    cluster.wait_assigned("mu")
    family = prompts(rng, 120)
    for _ in range(12):  # chunks, so the stream has many batches to disturb
        cluster.random_traffic(rng, 40, family)
        cluster.wait_mu_caught_up()
    edge.finish(cluster, [mu])
    counts = sources[0].counts
    assert min(counts.dropped, counts.duplicated, counts.reordered, counts.delayed) > 0, counts
    # Anti-entropy alone would converge too: the stream's own gaps must trigger resyncs.
    assert edge.metric("kvc_edge_resyncs_total", cause="stream") > 0, "no resync on a gap"
    assert edge.metric("kvc_edge_batches_skipped_total") > 0, "no duplicate was skipped"


def test_garbage_events_go_to_the_dead_letter_topic(cluster: Cluster) -> None:
    rng = np.random.default_rng(9)
    mu = cluster.start_mu()
    edge = cluster.start_edge()
    cluster.random_traffic(rng, 100, prompts(rng, 60))
    garbage = [
        b"",
        b"\x00\x01\x02 not msgpack",
        b"\x81\xa1t\xa9kv_events",  # a map with a tag but no version
        bytes(range(256)),
        # valid msgpack, wrong message type
        b"\x83\xa1t\xabdead_letter\xa1v\x92\x01\x00\xa2tp\xa1x",
    ]
    for i, payload in enumerate(garbage):
        cluster.producer.produce(cluster.events_topic, payload, partition=i % N_SHARDS)
    # A well-formed batch from a worker that does not exist.
    from kvcompass.index.layout import Tier
    from kvcompass.wire import EventKind, KVEvent, KVEventBatch, encode

    stranger = KVEventBatch("ghost-7", "us", 1, 0, 0, (KVEvent(EventKind.ADMIT, Tier.VRAM, ()),))
    cluster.producer.produce(cluster.events_topic, encode(stranger), partition=0)
    cluster.producer.flush(30)
    cluster.random_traffic(rng, 100, prompts(rng, 60))
    cluster.finish([mu], edge)

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"dlq-reader-{cluster.tag}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(cluster.dlq_topic, 0, 0)])
    letters: list[DeadLetter] = []

    def all_letters() -> bool:
        for message in consumer.consume(100, 0.2):
            if message.error() is None:
                letters.append(decode(message.value() or b"", DeadLetter))
        return len(letters) >= len(garbage) + 1

    try:
        poll_until(all_letters, 30, "dead letters")
    finally:
        consumer.close()
    assert len(letters) == len(garbage) + 1
    assert sorted(letter.payload for letter in letters) == sorted([*garbage, encode(stranger)])
    assert all(letter.reason for letter in letters)
    assert any("unknown worker" in letter.reason for letter in letters)


def test_the_edge_reads_what_the_pipeline_delivered_through_the_prefix_chain(
    cluster: Cluster,
) -> None:
    """A holder whose shorter prefixes were evicted (its keys start past a gap) reaches
    the edge's shared-memory views through the broker, a maintenance unit and the
    replayer. The paper's lookup credits its longest key; a chained query (KVCompass's
    default) credits it nothing, while an intact holder counts in full either way."""
    rng = np.random.default_rng(21)
    prompt = prompts(rng, 1)[0][:4096]
    broken, intact = cluster.topology.worker("us-0"), cluster.topology.worker("us-1")
    mu = cluster.start_mu()
    edge = cluster.start_edge()
    cluster.publish(broken.id, EventKind.ADMIT, prompt[:2048], Tier.VRAM)
    cluster.publish(broken.id, EventKind.EVICT, prompt[:256], Tier.ABSENT)  # 128 and 256
    cluster.publish(intact.id, EventKind.ADMIT, prompt[:1024], Tier.VRAM)
    # A prefix's keys sit in several shards, whose patches reach the edge one by one:
    # a view read before every shard has caught up can show a holder's longest key
    # without its shorter ones (a chain broken only for now). Read once the edge has
    # applied every batch covering what was published.
    cluster.wait_edge_at(cluster.wait_mu_caught_up())
    plain = MultiLevelQuery.for_prompt(prompt, "us", cluster.plan, NS)
    chained = MultiLevelQuery.for_prompt(prompt, "us", cluster.plan, NS, chained=True)
    reader = SharedIndexReader(cluster.shm_prefix, cluster.layout)
    try:
        assert matched(reader, plain) == {broken.index: 2048, intact.index: 1024}
        assert matched(reader, chained) == {intact.index: 1024}
    finally:
        reader.close()
    cluster.finish([mu], edge)


def matched(reader: SharedIndexReader, query: MultiLevelQuery) -> dict[int, int]:
    return {w: n for w, (n, _) in reader.match(query).holders().items()}
