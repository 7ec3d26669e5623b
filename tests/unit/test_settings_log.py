"""Settings from KVC_* variables and the JSON log set-up (no servers needed)."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from confluent_kafka import KafkaError

from kvcompass.errors import ConfigError
from kvcompass.log import configure
from kvcompass.services.health import Health
from kvcompass.services.infra import InfraSettings
from kvcompass.services.kafka import BrokerWatch, KafkaLog
from kvcompass.settings import SettingsError


def test_from_env_reads_typed_values() -> None:
    env = {
        "KVC_SHARDS": " 8 ",
        "KVC_START_TIMEOUT": "2.5",
        "KVC_RUN_DIR": "/tmp/kvc-run",
        "KVC_LOG_JSON": "No",
        "KVC_LOG_LEVEL": "DEBUG",
        "KVC_KAFKA_BOOTSTRAP": "",
        "KVC_TOPIC_EVENTS": "my.events",
    }
    settings = InfraSettings.from_env(env, shards=16)
    assert settings.shards == 16  # explicit overrides win over the environment
    assert settings.start_timeout == 2.5
    assert settings.run_dir == Path("/tmp/kvc-run")
    assert settings.log_json is False
    assert settings.log_level == "debug"
    assert settings.kafka_bootstrap is None  # empty = not set
    assert settings.topic_events == "my.events"
    assert InfraSettings.from_env({}) == InfraSettings()


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("KVC_SHARDS", "four", "KVC_SHARDS='four': expected an integer"),
        ("KVC_SHARDS", "0", "KVC_SHARDS=0: must be at least 1"),
        ("KVC_STOP_TIMEOUT", "soon", "KVC_STOP_TIMEOUT='soon': expected a number"),
        # NaN passes a "<= 0" range check; inf is no timeout either.
        ("KVC_STOP_TIMEOUT", "nan", "KVC_STOP_TIMEOUT='nan': expected a finite number"),
        ("KVC_START_TIMEOUT", "inf", "KVC_START_TIMEOUT='inf': expected a finite number"),
        ("KVC_LOG_JSON", "maybe", "KVC_LOG_JSON='maybe': expected a boolean"),
        ("KVC_LOG_LEVEL", "loud", "KVC_LOG_LEVEL='loud': expected one of debug, info"),
        ("KVC_TOPIC_QUEUES", "kvc.events", "topic names must be distinct"),
    ],
)
def test_bad_values_name_the_variable(
    var: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        InfraSettings.from_env()


def test_settings_errors_are_config_errors_and_run_dir_is_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert issubclass(SettingsError, ConfigError)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVC_RUN_DIR", "run/x")
    settings = InfraSettings.from_env()
    monkeypatch.chdir("/")
    assert settings.run_dir == tmp_path / "run" / "x"  # resolved once, at start
    assert settings.state_file == tmp_path / "run" / "x" / "state.json"


def test_unknown_override_is_rejected() -> None:
    with pytest.raises(TypeError, match="no settings"):
        InfraSettings.from_env({}, shard=3)


def test_as_dict_masks_url_passwords_and_describe_documents_every_field() -> None:
    settings = InfraSettings(redis_url="redis://kvc:s3cret@redis:6379/0")
    assert settings.as_dict()["redis_url"] == "redis://kvc:***@redis:6379/0"
    rows = {row.env: row for row in InfraSettings.describe()}
    assert rows["KVC_SHARDS"].default == "4"
    assert rows["KVC_RUN_DIR"].default == "run/infra"
    assert all(row.doc for row in rows.values())


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_logging")
def test_configure_writes_json_lines_for_structlog_and_stdlib() -> None:
    out = io.StringIO()
    configure("info", json=True, service="test", stream=out)
    log = structlog.get_logger("t")
    log.debug("hidden")
    log.info("topics_ready", shards=4)
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    logging.getLogger("kvcompass.kafka.admin").warning("librdkafka %s", "said")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["event"], r["level"]) for r in lines] == [
        ("topics_ready", "info"),
        ("failed", "error"),
        ("librdkafka said", "warning"),
    ]
    assert lines[0]["shards"] == 4
    assert lines[0]["timestamp"].endswith("Z")
    assert lines[1]["exception"][0]["exc_type"] == "ValueError"
    assert "locals" not in lines[1]["exception"][0]["frames"][0]
    assert lines[2]["logger"] == "kvcompass.kafka.admin"


@pytest.mark.usefixtures("restore_logging")
def test_every_line_names_the_service_and_pid() -> None:
    out = io.StringIO()
    configure("info", json=True, service="edge", stream=out)
    structlog.get_logger("t").bind(shard=3).info("shard_loaded")
    logging.getLogger("redis").warning("reconnecting")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["service"], r["pid"]) for r in lines] == [("edge", os.getpid())] * 2
    assert lines[0]["shard"] == 3


@pytest.mark.usefixtures("restore_logging")
def test_librdkafka_lines_become_structured_events() -> None:
    out = io.StringIO()
    configure("info", json=True, service="mu", stream=out)
    kafka_log = KafkaLog()
    kafka_log.log(logging.WARNING, "%s [%s] %s", "REQTMOUT", "rdkafka#consumer-1", "timed out")
    # A refused connection repeats on every reconnect; BrokerWatch reports it once.
    kafka_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "refused")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [
        {
            "event": "librdkafka",
            "facility": "REQTMOUT",
            "client": "rdkafka#consumer-1",
            "text": "timed out",
            "service": "mu",
            "pid": os.getpid(),
            "level": "warning",
            "timestamp": lines[0]["timestamp"],
        }
    ]


@pytest.mark.usefixtures("restore_logging")
def test_broker_watch_sets_the_condition_and_logs_each_change_once() -> None:
    out = io.StringIO()
    configure("info", json=True, service="mu", stream=out)
    health = Health()
    watch = BrokerWatch(health)
    assert set(watch.client_config()) == {"error_cb", "logger"}
    watch.ok()
    assert health.ready()
    for _ in range(3):
        watch.on_error(KafkaError(KafkaError._TRANSPORT, "connect refused"))
        watch.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert not health.ready()
    assert health.report()["broker"].detail == "_ALL_BROKERS_DOWN: 1/1 brokers are down"
    watch.on_error(KafkaError(KafkaError._MSG_TIMED_OUT, "delivery timed out"))
    watch.ok()
    watch.ok()
    assert health.ready()
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert events == ["broker_reachable", "broker_unreachable", "kafka_error", "broker_reachable"]
