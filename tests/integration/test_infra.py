"""The infrastructure launcher: servers, topics, CLI life cycle, external and stale state."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kvcompass.services.infra import (
    Infra,
    InfraSettings,
    RunningInfra,
    TopicPartitionMismatch,
    ensure_topics,
)
from kvcompass.services.infra.processes import is_running
from kvcompass.services.infra.state import InfraState, write_state

pytestmark = pytest.mark.integration

WaitFor = Callable[..., Any]
# Loopback client settings (research/infra.md): short fetch wait, 6 s session timeout.
CONSUMER = {"fetch.wait.max.ms": 10, "session.timeout.ms": 6000, "enable.auto.commit": False}


def test_launcher_started_both_servers(infra: RunningInfra) -> None:
    status = Infra.status(infra.settings)
    assert status.healthy, status
    assert [s.name for s in status.services] == ["kafka", "redis"]
    for proc in infra.processes:  # empty when the servers are external
        assert is_running(proc.pid, proc.start_ticks)
        assert Path(proc.log).is_file()


def test_topics_have_the_configured_partition_counts(
    infra: RunningInfra, kafka_bootstrap: str
) -> None:
    s = infra.settings
    expected = {s.topic_events: s.shards, s.topic_patches: s.shards}
    expected |= {s.topic_events_dlq: 1, s.topic_queues: 1}
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert {name: len(topics[name].partitions) for name in expected} == expected
    assert infra.state.topics == expected
    # Idempotent: a second run finds them and changes nothing.
    assert ensure_topics(kafka_bootstrap, s, timeout=10) == expected


def test_produce_to_explicit_partition_and_consume_it(
    kafka_bootstrap: str, topic_factory: Callable[..., str], wait_for: WaitFor
) -> None:
    topic = topic_factory(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    for i in range(5):
        producer.produce(topic, value=b"v%d" % i, key=b"k", partition=2, headers={"i": b"%d" % i})
    assert producer.flush(10) == 0
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}.g", **CONSUMER}
    )
    try:
        consumer.assign([TopicPartition(topic, 2, 0)])
        got: list[Any] = []

        def five_records() -> bool:
            msg = consumer.poll(0.1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg)
            return len(got) >= 5

        wait_for(five_records, timeout=10, interval=0, message="5 records on partition 2")
    finally:
        consumer.close()
    assert [(m.partition(), m.offset(), m.value()) for m in got] == [
        (2, i, b"v%d" % i) for i in range(5)
    ]
    assert [m.headers() for m in got] == [[("i", b"%d" % i)] for i in range(5)]


def test_redis_set_get(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.set("kvc:test:key", b"\x00value")
        assert client.get("kvc:test:key") == b"\x00value"
    finally:
        client.close()


def test_existing_topic_with_wrong_partition_count_fails_clearly(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    events = topic_factory(partitions=2)
    settings = InfraSettings(
        shards=4,
        topic_events=events,
        topic_patches=topic_factory(partitions=None),
        topic_events_dlq=topic_factory(partitions=None),
        topic_queues=topic_factory(partitions=None),
    )
    with pytest.raises(TopicPartitionMismatch) as caught:
        ensure_topics(kafka_bootstrap, settings, timeout=10)
    text = str(caught.value)
    assert f"topic {events!r} exists with 2 partitions but 4 are required" in text
    assert "KVC_SHARDS=4" in text
    assert "KVC_SHARDS=2" in text  # the other way out
    assert "cannot be changed" in text


def test_external_addresses_start_nothing(
    infra: RunningInfra, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVC_KAFKA_BOOTSTRAP", infra.kafka_bootstrap)
    monkeypatch.setenv("KVC_REDIS_URL", infra.redis_url)
    monkeypatch.setenv("KVC_RUN_DIR", str(run_dir))
    settings = InfraSettings.from_env()
    with Infra.start(settings) as external:
        assert external.processes == ()
        assert (external.kafka_bootstrap, external.redis_url) == (
            infra.kafka_bootstrap,
            infra.redis_url,
        )
        status = Infra.status(settings)
        assert status.healthy
        assert [(s.pid, s.alive) for s in status.services] == [(None, None), (None, None)]
        assert not list(run_dir.glob("*.log"))
    assert not settings.state_file.exists()
    assert Infra.status(infra.settings).healthy  # the session's servers were left alone


def test_stale_and_unreadable_state_files_are_handled(run_dir: Path) -> None:
    settings = InfraSettings(run_dir=run_dir)
    run_dir.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state = InfraState.from_json(
        {
            "version": 1,
            "kafka_bootstrap": "127.0.0.1:1",
            "redis_url": "redis://127.0.0.1:1/0",
            "processes": [
                {
                    "name": "kafka",
                    "pid": gone.pid,
                    "port": 1,
                    "start_ticks": None,
                    "log": "kafka.log",
                    "argv": ["tansu"],
                },
            ],
            "created_at": "2026-01-01T00:00:00+00:00",
            "owner_pid": gone.pid,
            "topics": {},
            "startup_ms": None,
        }
    )
    write_state(settings.state_file, state)
    status = Infra.status(settings)
    assert status.state == state
    assert not status.healthy
    assert [(s.name, s.alive, s.answering) for s in status.services] == [
        ("kafka", False, False),
        ("redis", None, False),
    ]
    assert [(r.pid, r.outcome) for r in Infra.down(settings)] == [(gone.pid, "not running")]
    assert not settings.state_file.exists()

    settings.state_file.write_text("{not json")
    assert Infra.status(settings).problem is not None
    assert Infra.down(settings) == []
    assert not settings.state_file.exists()
    assert Infra.down(settings) == []  # nothing recorded: nothing to do


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not on PATH")
def test_cli_up_status_down_leaves_no_processes(run_dir: Path, wait_for: WaitFor) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    env |= {"KVC_RUN_DIR": str(run_dir), "KVC_LOG_JSON": "true"}
    script = Path(sys.executable).with_name("kvcompass")
    kvcompass = (
        [str(script)] if script.exists() else [sys.executable, "-m", "kvcompass.services.cli"]
    )
    module = [sys.executable, "-m", "kvcompass.services.infra"]

    def run(argv: list[str], expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == expect, (argv, done.stdout, done.stderr)
        return done

    up = json.loads(run([*kvcompass, "infra", "up", "--json"]).stdout)
    procs = {p["name"]: (p["pid"], p["start_ticks"]) for p in up["processes"]}
    assert sorted(procs) == ["kafka", "redis"]
    assert up["topics"] == {"kvc.events": 4, "kvc.patches": 4, "kvc.events.dlq": 1, "kvc.queues": 1}
    assert all(is_running(pid, ticks) for pid, ticks in procs.values())
    assert (run_dir / "kafka.log").is_file()
    assert (run_dir / "redis.log").is_file()

    again = json.loads(run([*kvcompass, "infra", "up", "--json"]).stdout)
    assert again["already_running"]
    assert again["processes"] == up["processes"]
    status = json.loads(run([*module, "status", "--json"]).stdout)
    assert status["healthy"]
    assert all(s["answering"] for s in status["services"])

    down = run([*kvcompass, "infra", "down"]).stdout
    assert "kafka" in down
    assert "redis" in down
    wait_for(
        lambda: not any(is_running(pid, ticks) for pid, ticks in procs.values()),
        timeout=10,
        message="servers gone after down",
    )
    assert not (run_dir / "state.json").exists()
    assert "nothing to stop" in run([*kvcompass, "infra", "down"]).stdout
    run([*module, "status"], expect=3)
