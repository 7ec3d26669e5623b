"""Start-up of the real services (``python -m kvcompass.services.{maintenance,edge}``):
every wrong setting or unreachable dependency is refused within a bounded time, with
exit status 2 and one JSON line naming the setting and its value; a good start serves
/healthz, /readyz and /metrics, and every log line names the service and its pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from kvcompass.loadgen.testing import poll_until
from kvcompass.services.infra import RunningInfra

pytestmark = pytest.mark.integration

MODULES = {"mu": "kvcompass.services.maintenance", "edge": "kvcompass.services.edge"}
START_TIMEOUT_S = 2.0
# Interpreter start and imports (numpy, numba, scipy) on two busy cores, plus the checks.
BOUND_S = START_TIMEOUT_S + 25


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(infra: RunningInfra, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    env |= {
        "KVC_KAFKA_BOOTSTRAP": infra.kafka_bootstrap,
        "KVC_REDIS_URL": infra.redis_url,
        "KVC_START_TIMEOUT_S": str(START_TIMEOUT_S),
        "KVC_LOG_JSON": "true",
        **overrides,
    }
    return env


def refused(service: str, env: dict[str, str]) -> dict[str, Any]:
    """Run ``service`` expecting a refusal: exit 2 in bounded time, one JSON line."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", MODULES[service]],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_S + 30,
        check=False,
    )
    elapsed = time.monotonic() - t0
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert elapsed < BOUND_S, elapsed
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line: dict[str, Any] = json.loads(lines[0])
    assert line["event"] == "start_refused"
    assert line["service"] == service
    assert line["exit_status"] == 2
    assert "exception" not in line  # no traceback for a refusal
    return line


@pytest.mark.parametrize("service", ["mu", "edge"])
def test_garbage_bootstrap_is_refused(service: str, infra: RunningInfra) -> None:
    line = refused(service, _env(infra, KVC_KAFKA_BOOTSTRAP="kafka:notaport"))
    assert "KVC_KAFKA_BOOTSTRAP='kafka:notaport'" in line["error"]
    assert "expected host:port" in line["error"]


def test_unreachable_bootstrap_is_refused_after_the_start_timeout(infra: RunningInfra) -> None:
    address = f"127.0.0.1:{_free_port()}"
    line = refused("edge", _env(infra, KVC_KAFKA_BOOTSTRAP=address))
    assert f"KVC_KAFKA_BOOTSTRAP={address!r}: no broker answered within 2 s" in line["error"]
    assert "Connection refused" in line["error"]


def test_missing_topic_is_refused_and_not_created(infra: RunningInfra) -> None:
    topic = f"kvc.missing.{os.getpid()}.patches"
    line = refused("edge", _env(infra, KVC_TOPIC_PATCHES=topic))
    assert f"KVC_TOPIC_PATCHES={topic!r}: no such topic" in line["error"]
    topics = AdminClient({"bootstrap.servers": infra.kafka_bootstrap}).list_topics(timeout=10)
    assert topic not in topics.topics  # the check asked for all topics, not this one


@pytest.mark.parametrize("service", ["mu", "edge"])
def test_partition_count_other_than_shards_is_refused_naming_both(
    service: str, infra: RunningInfra, topic_factory: Callable[..., str]
) -> None:
    env = _env(
        infra,
        KVC_SHARDS="4",
        KVC_TOPIC_EVENTS=topic_factory(partitions=2),
        KVC_TOPIC_PATCHES=topic_factory(partitions=2),
        KVC_TOPIC_EVENTS_DLQ=topic_factory(partitions=1),
    )
    line = refused(service, env)
    assert "exists with 2 partitions but 4 are required" in line["error"]
    assert "KVC_SHARDS=4" in line["error"]
    assert "KVC_SHARDS=2" in line["error"]  # the way out


def test_unreachable_redis_is_refused(infra: RunningInfra) -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"
    line = refused("mu", _env(infra, KVC_REDIS_URL=url))
    assert f"KVC_REDIS_URL={url!r}: Redis did not answer within 2 s" in line["error"]


def test_bad_redis_url_is_refused(infra: RunningInfra) -> None:
    line = refused("edge", _env(infra, KVC_REDIS_URL="http://127.0.0.1:6379"))
    assert "KVC_REDIS_URL='http://127.0.0.1:6379'" in line["error"]
    assert "redis://" in line["error"]  # the schemes it accepts


def test_metrics_port_in_use_is_refused(infra: RunningInfra) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused("mu", _env(infra, KVC_METRICS_PORT=str(port)))
    assert f"KVC_METRICS_PORT={port}: cannot listen on 127.0.0.1:{port}" in line["error"]


def test_bad_setting_value_is_refused(infra: RunningInfra) -> None:
    line = refused("edge", _env(infra, KVC_SHARDS="four"))
    assert line["error"] == "KVC_SHARDS='four': expected an integer"


def test_unknown_topology_is_refused(infra: RunningInfra) -> None:
    line = refused("mu", _env(infra, KVC_TOPOLOGY="/nowhere/topology.toml"))
    assert "KVC_TOPOLOGY='/nowhere/topology.toml'" in line["error"]


@pytest.mark.parametrize(
    ("module", "service"),
    [(MODULES["mu"], "mu"), ("kvcompass.services.wanproxy", "wanproxy")],
)
def test_a_variable_no_program_reads_is_named_at_start_with_the_nearest_known_one(
    module: str, service: str
) -> None:
    # KVC_FLSH_MS left the flush window at its default without a word. KVC_REGION is the
    # router's and KVC_TRACES the report's: a shared env file holds them, nothing to say.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    env |= {
        "KVC_KAFKA_BOOTSTRAP": "127.0.0.1:1",  # refused fast: the warning comes before
        "KVC_REDIS_URL": "redis://127.0.0.1:1",
        "KVC_START_TIMEOUT_S": "0.5",
        "KVC_LOG_JSON": "true",
        "KVC_FLSH_MS": "5",
        "KVC_REGION": "us",
        "KVC_TRACES": "/nowhere",
        "KVC_TOPOLOGY": "/nowhere/topology.toml",  # the WAN proxy's fast refusal
    }
    done = subprocess.run(
        [sys.executable, "-m", module],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_S + 30,
        check=False,
    )
    first, *rest = (json.loads(line) for line in done.stderr.splitlines())
    assert {k: first[k] for k in ("event", "level", "variable", "did_you_mean", "service")} == {
        "event": "unknown_setting",
        "level": "warning",
        "variable": "KVC_FLSH_MS",
        "did_you_mean": "KVC_FLUSH_MS",
        "service": service,
    }
    assert [line["event"] for line in rest] == ["start_refused"]


@pytest.mark.parametrize("service", ["mu", "edge"])
def test_help_prints_the_settings_table(service: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", MODULES[service], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"Usage: kvcompass {service}" in done.stdout
    for variable in ("KVC_KAFKA_BOOTSTRAP", "KVC_SHARDS", "KVC_METRICS_PORT",
                     "KVC_START_TIMEOUT_S", "KVC_DRAIN_TIMEOUT_S"):  # fmt: skip
        assert f"  {variable} (" in done.stdout
    assert "Exit statuses" in done.stdout


def test_a_good_start_serves_status_and_logs_service_and_pid(
    infra: RunningInfra, tmp_path: Any
) -> None:
    port = _free_port()
    env = _env(infra, KVC_METRICS_PORT=str(port), KVC_SHM_PREFIX=f"kvcst{os.getpid()}")
    stderr = tmp_path / "edge.log"
    with stderr.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", MODULES["edge"]], env=env, stderr=err)
    try:

        def phase() -> str | None:
            assert proc.poll() is None, stderr.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return str(json.loads(r.read())["phase"])
            except OSError:
                return None

        poll_until(lambda: phase() == "running", 60, "edge running")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            assert "kvc_edge_batches_applied_total" in reply.read().decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = [json.loads(line) for line in stderr.read_text().splitlines()]
    assert {(line["service"], line["pid"]) for line in lines} == {("edge", proc.pid)}
    assert [line["event"] for line in lines if line["event"] in ("running", "stopped")] == [
        "running",
        "stopped",
    ]


def test_unset_addresses_without_infra_state_are_refused_naming_the_run_dir(
    infra: RunningInfra, tmp_path: Any
) -> None:
    env = _env(infra, KVC_RUN_DIR="rel/run")
    del env["KVC_KAFKA_BOOTSTRAP"], env["KVC_REDIS_URL"]
    done = subprocess.run(
        [sys.executable, "-m", MODULES["mu"]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    state_file = tmp_path / "rel" / "run" / "state.json"
    assert f"{state_file} records no servers" in line["error"]  # absolute, resolved once
    assert "kvcompass infra up" in line["error"]


@pytest.mark.parametrize("service", ["mu", "edge"])
def test_kvcompass_command_prints_the_service_help(
    service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcompass.services.cli import main

    assert main([service, "--help"]) == 0
    assert "KVC_SHARDS (int, default 4)" in capsys.readouterr().out
    assert main([service, "extra"]) == 2
    assert "takes no arguments" in capsys.readouterr().err
