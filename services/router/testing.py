"""Test and benchmark helpers: a stub worker speaking the worker HTTP API's shape, and
serving any ASGI app from a thread on a free loopback port.

The stub is not the emulated worker (``kvcompass worker``): it answers at once with a
fixed reuse report, so tests control every field and benchmarks measure the router,
not a cost model.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvcompass.services.router.server import QuietServer, config

__all__ = ["StubWorker", "serve_in_thread"]


@dataclass
class StubWorker:
    """One worker's stand-in. ``mode``: "ok", "fail" (500) or "reject" (400); every
    answer starts after ``delay_s``.

    ``gate``: when set, a stream sends its first token, then waits for the gate before
    each further one (tests see the tokens arrive one by one). ``requests`` keeps every
    body received.
    """

    worker_id: str
    region: str
    mode: str = "ok"
    reused_tokens: int = 0
    queue_ms: dict[str, float] = field(default_factory=dict)
    gate: threading.Semaphore | None = None
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    migrations: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/migrate", self._migrate, methods=["POST"]),
            ]
        )

    async def _migrate(self, request: Request) -> Response:
        self.migrations.append(json.loads(await request.body()))
        return JSONResponse({"accepted": True}, status_code=202)

    def _kvc(self) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "region": self.region,
            "reused_tokens": self.reused_tokens,
            "reused_tier": "vram" if self.reused_tokens else "none",
            "timings_ms": {"queue": 0.0, "reload": 0.0, "prefill": 0.0, "decode": 0.0, "ttft": 0.0},
            "queues": {
                "region": self.region,
                "seq": len(self.requests),
                "sent_at_ns": time.time_ns(),
                "queue_ms": self.queue_ms,
            },
        }

    async def _complete(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "fail":
            return JSONResponse({"error": {"message": "stub failure"}}, status_code=500)
        if self.mode == "reject":
            error = {"message": "stub rejects", "type": "invalid_request_error", "code": "x"}
            return JSONResponse({"error": error}, status_code=400)
        n_prompt, n_out = len(body["prompt"]), int(body.get("max_tokens", 16))
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": self.reused_tokens},
        }
        head = {
            "id": body["kvc"]["request_id"],
            "object": "text_completion",
            "model": body["model"],
        }
        if not body.get("stream"):
            text = "".join(f"t{i} " for i in range(n_out))
            choice = {"index": 0, "text": text, "finish_reason": "length"}
            return JSONResponse({**head, "choices": [choice], "usage": usage, "kvc": self._kvc()})
        return StreamingResponse(self._events(head, n_out, usage), media_type="text/event-stream")

    async def _events(self, head: dict[str, Any], n_out: int, usage: dict[str, Any]) -> Any:
        for i in range(n_out):
            if i and self.gate is not None:
                await asyncio.to_thread(self.gate.acquire)
            last = i == n_out - 1
            choice = {"index": 0, "text": f"t{i} ", "finish_reason": "length" if last else None}
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if last:
                chunk |= {"usage": usage, "kvc": self._kvc()}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve_in_thread(app: object) -> Iterator[str]:
    """Serve ``app`` on a free loopback port from a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    server = QuietServer(config(app))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="asgi", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
