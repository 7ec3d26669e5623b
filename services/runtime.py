"""What every service's ``__main__`` does: settings, logging, topology, signals."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TypeVar

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from kvcompass import log as kvc_log
from kvcompass.services.infra import InfraError, InfraSettings
from kvcompass.services.infra.state import read_state
from kvcompass.settings import ClusterSettings, SettingsError, redact_url
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology

__all__ = ["load_any_topology", "serve_metrics", "start_service", "stop_on_signals"]

S = TypeVar("S", bound=ClusterSettings)


def load_any_topology(name_or_path: str) -> Topology:
    """A built-in topology by name, else a TOML file path."""
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


def start_service(cls: type[S], prog: str) -> tuple[S, str, str] | None:
    """Read settings, configure logging and resolve the broker and Redis addresses.

    Returns (settings, kafka bootstrap, redis url), or None after printing why the
    service cannot start (the caller exits with status 2).
    """
    try:
        settings = cls.from_env()
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    kvc_log.configure(settings.log_level, json=settings.log_json is not False)
    bootstrap, redis_url = settings.kafka_bootstrap, settings.redis_url
    if bootstrap is None or redis_url is None:
        # Empty means the embedded servers: take their addresses from the state file
        # `kvcompass infra up` wrote (same KVC_RUN_DIR).
        try:
            state = read_state(InfraSettings.from_env().state_file)
        except (InfraError, SettingsError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return None
        if state is None:
            print(
                f"{prog}: set KVC_KAFKA_BOOTSTRAP and KVC_REDIS_URL, or start the embedded "
                "servers with `kvcompass infra up`",
                file=sys.stderr,
            )
            return None
        bootstrap = bootstrap or state.kafka_bootstrap
        redis_url = redis_url or state.redis_url
    resolved = {"kafka_bootstrap": bootstrap, "redis_url": redact_url(redis_url)}
    structlog.get_logger(prog).info("settings", **{**settings.as_dict(), **resolved})
    return settings, bootstrap, redis_url


def stop_on_signals(stop: threading.Event, prog: str) -> None:
    """SIGTERM / SIGINT set ``stop`` (a graceful drain); a second one exits at once."""
    log = structlog.get_logger(prog)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise SystemExit(1)
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def serve_metrics(port: int, registry: CollectorRegistry) -> None:
    """Expose ``registry`` for Prometheus on 127.0.0.1:``port`` (0: not at all)."""
    if port:
        start_http_server(port, "127.0.0.1", registry=registry)
