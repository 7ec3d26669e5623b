"""A service's HTTP status endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

- ``/metrics``: the service's Prometheus registry.
- ``/healthz``: 200 while the process serves, with its ``phase`` (starting, running,
  draining): liveness, and how a test harness sees that a service has started.
- ``/readyz``: 200 when every readiness condition is ok, else 503; the JSON body lists
  every condition and, under ``failing``, the detail of each one that is not ok.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvcompass.services.health import Health

__all__ = ["StatusServer"]

_log = structlog.get_logger("kvcompass.status")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed request (a probe that hung up): one log line, not a traceback."""
        _log.warning("status_request_failed", client=str(client_address), exc_info=True)


class StatusServer:
    """Binds at construction (so a taken port fails before anything else starts) and
    serves from a daemon thread between ``__enter__`` and ``__exit__``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        service: str,
        registry: CollectorRegistry,
        health: Health,
        phase: Callable[[], str],
    ) -> None:
        def healthz() -> tuple[int, dict[str, Any]]:
            return 200, {"service": service, "pid": os.getpid(), "phase": phase()}

        def readyz() -> tuple[int, dict[str, Any]]:
            report = health.report()
            ready = health.ready()
            body = {
                "ready": ready,
                "conditions": health.conditions_json(),
                "failing": {n: c.detail for n, c in report.items() if not c.ok},
            }
            return (200 if ready else 503), body

        routes = {"/healthz": healthz, "/readyz": readyz}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in routes:
                    status, body = routes[path]()
                    self._reply(status, json.dumps(body).encode(), "application/json")
                else:
                    self._reply(404, b"not found\n", "text/plain")

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds are not worth a log line each."""

        self._server = _Server((host, port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="status-http", daemon=True
        )

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
