"""The edge router's HTTP API (Starlette): decide, forward, fold the answer back in.

One :class:`RouterApp` per process. Every policy call happens on the event loop (the
queue consumer thread hands its vectors over), so the policy needs no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import structlog
from numpy.typing import NDArray
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvcompass.index.reader import IndexNotReady
from kvcompass.keys import Namespace
from kvcompass.services.health import Health
from kvcompass.services.router.chat import chat_chunk, chat_completion
from kvcompass.services.router.decision_json import decision_json
from kvcompass.services.router.metrics import RouterMetrics
from kvcompass.services.router.openai import (
    ApiError,
    CompletionRequest,
    parse_chat,
    parse_completion,
    parse_json,
)
from kvcompass.services.router.policy import (
    Decision,
    Feedback,
    RegionQueues,
    RouteRequest,
    RoutingPolicy,
)
from kvcompass.services.router.tenancy import Tenancy
from kvcompass.services.router.tokenizer import Tokenizer
from kvcompass.services.router.upstream import Upstream, UpstreamFailed, sse_events
from kvcompass.services.router.views import IndexMode, IndexStatus
from kvcompass.topology import Topology

__all__ = ["RouterApp"]

Handler = Callable[[Request], Awaitable[Response]]
_COMPLETIONS = "/v1/completions"


class RouterApp:
    """The state one router process serves from, and its Starlette app (``.app``)."""

    def __init__(
        self,
        *,
        topology: Topology,
        region: str,
        policy: RoutingPolicy,
        upstream: Upstream,
        tenancy: Tenancy,
        tokenizer: Tokenizer,
        health: Health,
        registry: CollectorRegistry,
        index: IndexStatus,
        max_body_bytes: int,
        metrics_registry: CollectorRegistry | None = None,
        discovery_wait: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``registry`` is what ``/metrics`` serves; the metrics go to
        ``metrics_registry`` when given (a process group: each writes its own, the scrape
        merges the group's). ``discovery_wait(seconds)`` pays a decision's ``lookup_ms``
        before forwarding (a baseline's DHT hops or directory round trip: the simulator
        charges it too)."""
        self.topology = topology
        self.region = region
        self.policy = policy
        self.upstream = upstream
        self.tenancy = tenancy
        self.tokenizer = tokenizer
        self.health = health
        self.registry = registry
        self.metrics = RouterMetrics(metrics_registry or registry)
        self.index = index
        self._max_body = max_body_bytes
        self._discovery_wait = discovery_wait
        self._ids = {w.index: w.id for w in topology.workers}
        self._index = {w.id: w.index for w in topology.workers}
        self._log = structlog.get_logger("kvcompass.router")
        self._pid = str(os.getpid())  # which process of a group served: for operators
        self._tasks: set[asyncio.Task[None]] = set()
        self.app = Starlette(
            routes=[
                Route(_COMPLETIONS, self._api("completions", self.completions), methods=["POST"]),
                Route(
                    "/v1/chat/completions",
                    self._api("chat", self.chat_completions),
                    methods=["POST"],
                ),
                Route("/v1/route", self._api("route", self.route), methods=["POST"]),
                Route("/healthz", self.healthz),
                Route("/readyz", self.readyz),
                Route("/metrics", self.metrics_page),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.upstream.start()
        try:
            yield
        finally:
            await self.upstream.close()

    # -- policy callbacks from elsewhere ---------------------------------------------

    def on_queues(self, queues: RegionQueues) -> None:
        """From the queue consumer, on the loop."""
        self.policy.on_queues(queues)

    # -- endpoints ------------------------------------------------------------------

    def _api(self, endpoint: str, handler: Handler) -> Handler:
        """Errors as OpenAI bodies; every request counted by status."""

        async def wrapped(request: Request) -> Response:
            try:
                response = await handler(request)
            except ApiError as exc:
                if exc.status >= 500:
                    self._log.warning("request_failed", endpoint=endpoint, error=exc.message)
                response = JSONResponse(exc.body(), status_code=exc.status)
            self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
            return response

        return wrapped

    async def _body(self, request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise _too_large(self._max_body)
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self._max_body:
                raise _too_large(self._max_body)
        return parse_json(bytes(raw))

    async def _parsed(self, request: Request, chat: bool) -> tuple[str, CompletionRequest]:
        tenant = self.tenancy.tenant(request.headers.get("authorization"))
        body = await self._body(request)
        model = self.topology.model
        parse = parse_chat if chat else parse_completion
        return tenant, parse(body, model.name, model.context_tokens, self.tokenizer)

    def _decide(
        self, tenant: str, request_id: str, tokens: NDArray[np.uint32], explain: bool = False
    ) -> tuple[Decision, float, IndexMode]:
        route = RouteRequest(
            request_id=request_id,
            tokens=tokens,
            origin_region=self.region,
            namespace=Namespace(self.topology.model.name, tenant),
        )
        start = time.perf_counter()
        try:
            decision = self.policy.decide(route, explain)
        except IndexNotReady as exc:
            raise ApiError(
                503,
                f"the edge's index is not ready, try again: {exc}",
                code="index_not_ready",
                type="server_error",
            ) from None
        seconds = time.perf_counter() - start
        mode = self.index.mode
        self.metrics.decided(decision, seconds, mode)
        return decision, seconds, mode

    async def route(self, request: Request) -> Response:
        tenant = self.tenancy.tenant(request.headers.get("authorization"))
        body = await self._body(request)
        model = self.topology.model
        parse = parse_chat if "messages" in body else parse_completion
        parsed = parse(body, model.name, model.context_tokens, self.tokenizer)
        decision, seconds, mode = self._decide(tenant, _request_id(request), parsed.tokens, True)
        answer = decision_json(
            decision,
            self.topology,
            policy=self.policy.name,
            origin=self.region,
            namespace=tenant,
            prompt_tokens=len(parsed.tokens),
            decide_us=seconds * 1e6,
        )
        return JSONResponse({**answer, "index": mode})

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def _complete(self, request: Request, chat: bool) -> Response:
        tenant, parsed = await self._parsed(request, chat)
        request_id = _request_id(request)
        decision, _, mode = self._decide(tenant, request_id, parsed.tokens)
        if decision.lookup_ms > 0:
            await self._discovery_wait(decision.lookup_ms / 1000)
        if decision.migration is not None:
            self._migrate(decision, parsed.tokens, tenant)
        targets = [decision, *(self._retarget(decision, w) for w in decision.fallbacks[:1])]
        failures: list[UpstreamFailed] = []
        for target in targets:
            body = self._worker_body(parsed, target, tenant, request_id)
            self.policy.on_forward(target, self._service_ms(target))
            if target.region != self.region:
                self.metrics.cross_region.labels(target.region).inc()
            try:
                headers = self._headers(target, request_id, mode)
                if parsed.stream:
                    return await self._stream(target, body, chat, headers)
                return await self._whole(target, body, chat, headers)
            except UpstreamFailed as exc:
                failures.append(exc)
                self.metrics.upstream_failures.labels(target.worker_id).inc()
                self.policy.on_failure(target.worker)
                self._log.warning("forward_failed", request_id=request_id, error=str(exc))
        tried = "; ".join(map(str, failures))
        if any(f.reachable for f in failures):
            raise ApiError(
                502, f"the workers failed: {tried}", code="bad_gateway", type="server_error"
            )
        raise ApiError(
            503,
            f"no worker could be reached: {tried}",
            code="worker_unavailable",
            type="server_error",
        )

    # -- forwarding -----------------------------------------------------------------

    def _retarget(self, decision: Decision, worker: int) -> Decision:
        """The decision as it reads for a fallback worker (its own claim, from its
        candidate terms when the policy scored it)."""
        claimed = next((c.matched_tokens for c in decision.candidates if c.worker == worker), 0)
        w = self.topology.workers[worker]
        return dataclasses.replace(
            decision,
            worker=worker,
            worker_id=w.id,
            region=w.region,
            reason="fallback",
            claimed_tokens=claimed,
            fallbacks=(),
            migration=None,
        )

    @staticmethod
    def _service_ms(decision: Decision) -> float:
        """Pending work a forward adds to its worker's queue until the next report: its
        prefill (unpriced: candidates carry (1+λ)·prefill) and reload, which is what
        delays the next arrival's prefill."""
        for c in decision.candidates:
            if c.worker == decision.worker:
                return c.prefill_ms / (1.0 + decision.lam) + c.reload_ms
        return 0.0

    def _worker_body(
        self, parsed: CompletionRequest, target: Decision, tenant: str, request_id: str
    ) -> bytes:
        body = {
            **parsed.extra,
            "prompt": parsed.tokens,
            "stream": parsed.stream,
            "kvc": {
                "claimed_tokens": target.claimed_tokens,
                "origin_region": self.region,
                "namespace": tenant,
                "request_id": request_id,
            },
        }
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

    def _headers(self, target: Decision, request_id: str, mode: IndexMode) -> dict[str, str]:
        return {
            "x-kvc-index": mode,
            "x-kvc-worker": target.worker_id,
            "x-kvc-region": target.region,
            "x-kvc-reason": target.reason,
            "x-kvc-claimed-tokens": str(target.claimed_tokens),
            "x-request-id": request_id,
            "x-kvc-router-pid": self._pid,
        }

    async def _whole(
        self, target: Decision, body: bytes, chat: bool, headers: dict[str, str]
    ) -> Response:
        reply = await self.upstream.post(target.worker, _COMPLETIONS, body)
        if reply.status != 200:  # the worker refused the request: the client's problem
            return Response(reply.body, reply.status, headers, reply.content_type)
        try:
            answer = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            raise UpstreamFailed(
                target.worker_id, "answered 200 with a body that is not JSON", reachable=True
            ) from None
        self._observe(target, answer)
        if chat:
            return JSONResponse(chat_completion(answer), headers=headers)
        return Response(reply.body, 200, headers, "application/json")  # byte for byte

    async def _stream(
        self, target: Decision, body: bytes, chat: bool, headers: dict[str, str]
    ) -> Response:
        resp = await self.upstream.open_stream(target.worker, _COMPLETIONS, body)
        request_id = headers["x-request-id"]
        if resp.status != 200:
            data = await resp.read()
            resp.release()
            return Response(data, resp.status, headers, resp.content_type)

        async def events() -> AsyncIterator[bytes]:
            first = True
            try:
                async for event in sse_events(resp):
                    data = _sse_data(event)
                    if data is None or data == b"[DONE]":
                        yield event
                        continue
                    chunk: dict[str, Any] | None = None
                    if b'"kvc"' in data:  # the last chunk: fold its report in
                        chunk = orjson.loads(data)
                        self._observe(target, chunk)
                    if chat:
                        chunk = chunk if chunk is not None else orjson.loads(data)
                        event = b"data: " + orjson.dumps(chat_chunk(chunk, first)) + b"\n\n"
                    first = False
                    yield event  # completions: unchanged
            except (TimeoutError, OSError, ValueError) as exc:
                # Headers are sent: the client sees the stream end without [DONE].
                self.metrics.upstream_failures.labels(target.worker_id).inc()
                self.policy.on_failure(target.worker)
                self._log.warning("stream_broken", request_id=request_id, error=repr(exc))
            finally:
                resp.release()

        return StreamingResponse(events(), headers=headers, media_type="text/event-stream")

    def _observe(self, target: Decision, answer: dict[str, Any]) -> None:
        """Fold a worker's ``kvc`` report (reused tokens, its region's queues) in."""
        kvc = answer.get("kvc")
        if not isinstance(kvc, dict):
            return
        reused = kvc.get("reused_tokens")
        reused = reused if isinstance(reused, int) else 0
        self.policy.observe(
            Feedback(
                worker=target.worker,
                claimed_tokens=target.claimed_tokens,
                reused_tokens=reused,
                queue_vector=self._queues(kvc.get("queues")),
                cross_region=target.region != self.region,
            )
        )
        self.metrics.claims(target.claimed_tokens, reused)

    def _queues(self, raw: object) -> RegionQueues | None:
        if not isinstance(raw, dict):
            return None
        try:
            queue_ms = {self._index[k]: float(v) for k, v in raw["queue_ms"].items()}
            return RegionQueues(
                str(raw["region"]), int(raw["seq"]), int(raw["sent_at_ns"]), queue_ms
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            self._log.warning("bad_piggybacked_queues", queues=str(raw)[:200])
            return None

    def _migrate(self, decision: Decision, tokens: NDArray[np.uint32], tenant: str) -> None:
        """Send a migration order to its target; fire and forget (failures are logged)."""
        order = decision.migration
        assert order is not None
        body = {
            "prompt": tokens[: order.prefix_tokens].tolist(),
            "namespace": tenant,
            "mode": order.mode,
            **({} if order.source_worker is None else {"source": self._ids[order.source_worker]}),
        }

        async def send() -> None:
            try:
                await self.upstream.post(order.target_worker, "/v1/migrate", orjson.dumps(body))
            except UpstreamFailed as exc:
                self._log.warning("migration_failed", error=str(exc))

        task = asyncio.get_running_loop().create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- status ---------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def check_index(self) -> None:
        """Keep the ``views`` condition and the index gauges current. The views gate
        readiness until they are first live; after that, losing them degrades routing
        (see :mod:`~kvcompass.services.router.views`) and is reported, not gated: a
        probe that failed on it would take every gateway of the region out at once."""
        live, detail = self.index.check()
        if live:
            self.health.advise("views")
        self.health.set("views", live, detail)
        self.metrics.index_live.set(int(live))
        self.metrics.index_age.set(self.index.age_s())

    async def readyz(self, request: Request) -> Response:
        self.check_index()
        ready = self.health.ready()
        return JSONResponse(
            {"ready": ready, "conditions": self.health.conditions_json()},
            status_code=200 if ready else 503,
        )

    async def metrics_page(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if 0 < len(given) <= 128 else f"cmpl-{uuid.uuid4().hex}"


def _sse_data(event: bytes) -> bytes | None:
    for line in event.splitlines():
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
