"""The open-loop driver: sends each request at its arrival time to its origin region's
edge router (OpenAI ``/v1/completions`` with token-id prompts) and records what came
back. Open loop: a slow answer never delays the next send, so queueing shows up in the
latencies rather than in a lower offered load.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from kvcompass.loadgen.records import RequestRecord
from kvcompass.loadgen.workloads import LiveRequest

__all__ = ["KEEPALIVE_S", "DriverConfig", "RunResult", "drive"]

KEEPALIVE_S = 2.0


@dataclass(frozen=True)
class DriverConfig:
    """``routers``: origin region → router base URL; ``api_keys``: tenant → API key
    (a tenant without one is sent without ``Authorization``); ``model``: the body's
    ``model``; ``stream``: SSE (measures TTFT) or one JSON answer; ``timeout_s``: per
    request, in total; ``max_in_flight``: beyond this many open requests a due request
    is recorded as a client-side error instead of sent (keeps the loop open)."""

    routers: Mapping[str, str]
    api_keys: Mapping[str, str]
    model: str
    stream: bool = True
    timeout_s: float = 120.0
    max_in_flight: int = 4096

    def __post_init__(self) -> None:
        for region, url in self.routers.items():
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"router {region}={url} is not an http(s)://host:port URL")
        if not 0 < self.timeout_s < math.inf:  # inf overflowed the HTTP client's timer
            raise ValueError(f"timeout must be positive and finite, got {self.timeout_s}")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")


@dataclass(frozen=True)
class RunResult:
    """``duration_s``: from the first send to the last answer."""

    sent: int
    duration_s: float


async def drive(
    requests: Iterable[LiveRequest],
    config: DriverConfig,
    on_record: Callable[[RequestRecord], None],
) -> RunResult:
    """Send every request at ``start + at_s``; ``on_record`` gets each record as its
    request ends (completion order)."""
    # Idle connections are dropped well before the server's keep-alive ends (uvicorn: 5 s):
    # reusing one the server is closing loses the request (ServerDisconnectedError), and
    # over the WAN proxy the server's FIN takes a one-way delay to arrive.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(total=config.timeout_s)
    tasks: set[asyncio.Task[None]] = set()
    sent = 0
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        for request in requests:
            wait = start + request.at_s - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            late_ms = max(0.0, (time.perf_counter() - start - request.at_s) * 1000)
            record = _record(request, late_ms)
            sent += 1
            if request.origin_region not in config.routers:
                on_record(replace(record, error=f"no router for region {request.origin_region}"))
                continue
            if len(tasks) >= config.max_in_flight:
                on_record(replace(record, error="client limit: too many requests in flight"))
                continue
            task = asyncio.create_task(_send(session, config, request, record, on_record))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return RunResult(sent, time.perf_counter() - start)


def _record(request: LiveRequest, late_ms: float) -> RequestRecord:
    return RequestRecord(
        request_id=request.request_id,
        session=request.session,
        origin=request.origin_region,
        tenant=request.tenant,
        scheduled_s=request.at_s,
        late_ms=late_ms,
        prompt_tokens=len(request.tokens),
        max_tokens=request.max_tokens,
    )


async def _send(
    session: aiohttp.ClientSession,
    config: DriverConfig,
    request: LiveRequest,
    record: RequestRecord,
    on_record: Callable[[RequestRecord], None],
) -> None:
    url = config.routers[request.origin_region].rstrip("/") + "/v1/completions"
    body = {
        "model": config.model,
        "prompt": list(request.tokens),
        "max_tokens": request.max_tokens,
        "stream": config.stream,
    }
    headers = {"content-type": "application/json", "x-request-id": request.request_id}
    key = config.api_keys.get(request.tenant)
    if key:
        headers["authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=json.dumps(body), headers=headers) as resp:
            record = replace(record, status=resp.status, **_routing(resp.headers))
            if resp.status != 200:
                record = replace(record, error=_error_message(await resp.read(), resp.status))
            elif config.stream:
                record = await _read_stream(resp, record, t0)
            else:
                record = _with_usage(record, await resp.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        record = replace(record, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
    record = replace(record, e2e_ms=(time.perf_counter() - t0) * 1000)
    on_record(record)


async def _read_stream(
    resp: aiohttp.ClientResponse, record: RequestRecord, t0: float
) -> RequestRecord:
    done = False
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, other SSE fields
        if record.ttft_ms is None:
            record = replace(record, ttft_ms=(time.perf_counter() - t0) * 1000)
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            break
        chunk = json.loads(payload)
        if "error" in chunk:
            return replace(record, error=_error_message(payload, record.status))
        if chunk.get("usage"):
            record = _with_usage(record, chunk)
    if not done:
        return replace(record, error="stream ended without [DONE]")
    return record


def _routing(headers: Mapping[str, str]) -> dict[str, Any]:
    claimed = headers.get("x-kvc-claimed-tokens")
    return {
        "worker": headers.get("x-kvc-worker"),
        "region": headers.get("x-kvc-region"),
        "reason": headers.get("x-kvc-reason"),
        "claimed_tokens": int(claimed) if claimed and claimed.isdigit() else None,
    }


def _with_usage(record: RequestRecord, body: Mapping[str, Any]) -> RequestRecord:
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    kvc = body.get("kvc") or {}
    return replace(
        record,
        prompt_tokens=int(usage.get("prompt_tokens", record.prompt_tokens)),
        completion_tokens=usage.get("completion_tokens"),
        reused_tokens=details.get("cached_tokens"),
        # The worker's own report, when the router passed no headers (e.g. direct calls).
        worker=record.worker or kvc.get("worker"),
        region=record.region or kvc.get("region"),
    )


def _error_message(raw: bytes, status: int) -> str:
    """The OpenAI-style ``error.message`` if there is one, else the start of the body."""
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:200].decode(errors="replace")
    return f"HTTP {status}: {message}" if status else str(message)
