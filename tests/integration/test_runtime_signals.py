"""The process shell with a toy service (tests/integration/_toy_service.py): status
endpoint, signals, the total drain deadline, exit statuses and one-line fatal errors."""

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcompass.loadgen.testing import PollTimeout, poll_until
from kvcompass.services.infra import RunningInfra

pytestmark = pytest.mark.integration

TOY = Path(__file__).with_name("_toy_service.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of ``path`` on the status endpoint; (0, {}) if it is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


class Toy:
    """A running toy service process with its status port and captured stderr."""

    def __init__(self, infra: RunningInfra, tmp: Path, behaviour: str, **env: str) -> None:
        self.port = _free_port()
        self.stderr_path = tmp / f"toy-{behaviour}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
        environ |= {
            "KVC_KAFKA_BOOTSTRAP": infra.kafka_bootstrap,
            "KVC_REDIS_URL": infra.redis_url,
            "KVC_METRICS_PORT": str(self.port),
            "KVC_LOG_JSON": "true",
            "TOY_BEHAVIOUR": behaviour,
            **env,
        }
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(TOY)], env=environ, stderr=err)

    def wait_running(self) -> None:
        def running() -> bool:
            assert self.proc.poll() is None, self.lines()
            return get(self.port, "/healthz")[1].get("phase") == "running"

        poll_until(running, 60, "toy service running")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def lines(self) -> list[dict[str, Any]]:
        """Every stderr line, parsed: a line that is not JSON fails the test."""
        return [json.loads(line) for line in self.stderr_path.read_text().splitlines()]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def toys(infra: RunningInfra, tmp_path: Path) -> Iterator[list[Toy]]:
    started: list[Toy] = []
    yield started
    for toy in started:
        toy.kill()


def start(toys: list[Toy], infra: RunningInfra, tmp: Path, behaviour: str, **env: str) -> Toy:
    toy = Toy(infra, tmp, behaviour, **env)
    toys.append(toy)
    return toy


def test_status_endpoint_and_clean_drain(
    toys: list[Toy], infra: RunningInfra, tmp_path: Path
) -> None:
    toy = start(toys, infra, tmp_path, "drain")
    toy.wait_running()
    status, body = get(toy.port, "/readyz")
    assert status == 200
    assert body["ready"] is True
    assert {n for n, c in body["conditions"].items() if c["ok"]} == {
        "broker",
        "redis",
        "running",
        "toy",
    }
    healthz = get(toy.port, "/healthz")[1]
    assert healthz == {"service": "toy", "pid": toy.proc.pid, "phase": "running"}
    with urllib.request.urlopen(f"http://127.0.0.1:{toy.port}/metrics", timeout=2) as reply:
        assert "toy_runs_total 1.0" in reply.read().decode()

    toy.signal(signal.SIGTERM)
    assert toy.wait() == 0
    lines = toy.lines()
    assert [line["event"] for line in lines][-2:] == ["stopping", "stopped"]
    assert all(line["service"] == "toy" and line["pid"] == toy.proc.pid for line in lines)


def test_not_ready_while_draining_with_the_reason(
    toys: list[Toy], infra: RunningInfra, tmp_path: Path
) -> None:
    toy = start(toys, infra, tmp_path, "hang", KVC_DRAIN_TIMEOUT_S="30")
    toy.wait_running()
    toy.signal(signal.SIGTERM)

    seen: list[tuple[int, dict[str, Any]]] = []

    def draining() -> dict[str, Any] | None:
        seen.append(get(toy.port, "/readyz"))
        return seen[-1][1] if seen[-1][0] == 503 else None

    try:
        body = poll_until(draining, 30, "/readyz 503 while draining")
    except PollTimeout as exc:
        pytest.fail(f"{exc}; last replies: {seen[-3:]}")
    assert body["failing"] == {"running": "draining"}
    assert get(toy.port, "/healthz")[1]["phase"] == "draining"


def test_drain_is_bounded_in_total(toys: list[Toy], infra: RunningInfra, tmp_path: Path) -> None:
    toy = start(toys, infra, tmp_path, "hang", KVC_DRAIN_TIMEOUT_S="1.5")
    toy.wait_running()
    t0 = time.monotonic()
    toy.signal(signal.SIGTERM)
    assert toy.wait() == 3
    elapsed = time.monotonic() - t0
    assert 1.5 <= elapsed < 5, elapsed
    assert toy.lines()[-1]["event"] == "drain_timeout"


def test_second_signal_exits_at_once(toys: list[Toy], infra: RunningInfra, tmp_path: Path) -> None:
    toy = start(toys, infra, tmp_path, "hang", KVC_DRAIN_TIMEOUT_S="60")
    toy.wait_running()
    toy.signal(signal.SIGTERM)
    poll_until(lambda: get(toy.port, "/healthz")[1].get("phase") == "draining", 30, "draining")
    t0 = time.monotonic()
    toy.signal(signal.SIGINT)
    assert toy.wait() == 128 + signal.SIGINT
    assert time.monotonic() - t0 < 5
    assert toy.lines()[-1]["event"] == "stopping_now"


@pytest.mark.parametrize(
    ("behaviour", "status", "event", "error_type"),
    [
        ("invariant", 70, "fatal", "InvariantBroken"),
        ("transient", 3, "fatal", "Transient"),
        ("refuse", 2, "start_refused", "ConfigError"),
    ],
)
def test_fatal_error_is_one_json_line_and_its_exit_status(
    toys: list[Toy],
    infra: RunningInfra,
    tmp_path: Path,
    behaviour: str,
    status: int,
    event: str,
    error_type: str,
) -> None:
    toy = start(toys, infra, tmp_path, behaviour)
    assert toy.wait() == status
    lines = toy.lines()  # every line is JSON: no raw traceback on stderr
    fatal = [line for line in lines if line["event"] == event]
    assert len(fatal) == 1, lines
    assert fatal[0]["error_type"] == error_type
    assert fatal[0]["exit_status"] == status
    if event == "fatal":  # unexpected: the traceback travels in one field
        assert fatal[0]["exception"][0]["exc_type"] == error_type
    else:
        assert "exception" not in fatal[0]


def test_a_failed_thread_is_one_json_line(
    toys: list[Toy], infra: RunningInfra, tmp_path: Path
) -> None:
    toy = start(toys, infra, tmp_path, "thread_error")
    toy.wait_running()
    poll_until(
        lambda: any(line["event"] == "thread_failed" for line in toy.lines()),
        30,
        "thread_failed logged",
    )
    toy.signal(signal.SIGTERM)
    assert toy.wait() == 0
    failed = [line for line in toy.lines() if line["event"] == "thread_failed"]
    assert len(failed) == 1
    assert failed[0]["thread"] == "worker"
    assert failed[0]["exception"][0]["exc_value"] == "worker thread failed"
