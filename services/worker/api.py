"""The HTTP API of one emulated worker (Starlette): OpenAI completions over token ids,
migration, reset, health and metrics. See the service README for the bodies."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvcompass.keys import Namespace
from kvcompass.services.health import Health
from kvcompass.services.worker.node import WorkerNode
from kvcompass.topology import Topology
from kvcompass.worker import Emitted, MigrationMode, Request, Sequence

__all__ = ["ApiError", "QueueSnapshot", "build_app", "output_token", "token_text"]

_TOKEN_LIMIT = 1 << 32
_VOCAB = 128_256  # Llama 3's vocabulary: generated ids look like real ones

#: The region's queue vector as a response carries it: (region, seq, sent_at_ns, by id).
QueueSnapshot = Callable[[], dict[str, Any]]


class ApiError(Exception):
    """A refused request: an OpenAI-style error body with this status."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def output_token(request_id: str, index: int) -> int:
    """The ``index``-th generated token id of a request: deterministic per request."""
    return (hash_str(request_id) + 7919 * (index + 1)) % _VOCAB


def token_text(token: int) -> str:
    return f" t{token}"


def hash_str(text: str) -> int:
    # Python's str hash is salted per process; this one is stable across runs.
    return int.from_bytes(uuid.uuid5(uuid.NAMESPACE_OID, text).bytes[:4], "little")


@dataclass(frozen=True, slots=True)
class _Completion:
    request: Request
    stream: bool
    claimed_tokens: int
    origin_region: str | None


def build_app(
    node: WorkerNode,
    topology: Topology,
    *,
    queues: QueueSnapshot,
    piggybacked: Callable[[str], None],
    deliver: Callable[[], Awaitable[None]],
    health: Health,
    registry: CollectorRegistry,
) -> Starlette:
    """The app serving ``node``; ``queues`` snapshots its region's vector for responses,
    ``piggybacked(region)`` tells the sender one went to that region's edge and
    ``deliver()`` returns once the events sent so far reached the broker."""
    model = topology.model
    worker = node.worker
    metrics = node.metrics

    def kvc_extension(sequence: Sequence, origin: str | None) -> dict[str, Any]:
        t = sequence.timings()
        if origin is not None:
            piggybacked(origin)
        return {
            "worker": worker.id,
            "region": worker.region,
            "reused_tokens": sequence.reused.tokens,
            "reused_tier": sequence.reused.tier.name.lower(),
            "timings_ms": {
                "queue": round(t.queue, 3),
                "reload": round(t.reload, 3),
                "prefill": round(t.prefill, 3),
                "decode": round(t.decode, 3),
                "ttft": round(t.ttft, 3),
            },
            "queues": queues(),
        }

    def usage(sequence: Sequence) -> dict[str, Any]:
        prompt = len(sequence.request.tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": sequence.generated,
            "total_tokens": prompt + sequence.generated,
            "prompt_tokens_details": {"cached_tokens": sequence.reused.tokens},
        }

    def record(sequence: Sequence, claimed_tokens: int) -> None:
        metrics.requests.labels(worker.id, "ok").inc()
        metrics.claimed_tokens.labels(worker.id).inc(claimed_tokens)
        metrics.prompt_tokens.labels(worker.id).inc(len(sequence.request.tokens))
        tier = sequence.reused.tier.name.lower()
        metrics.reused_tokens.labels(worker.id, tier).inc(sequence.reused.tokens)
        metrics.ttft_ms.labels(worker.id).observe(sequence.timings().ttft)

    async def completions(http: HttpRequest) -> Response:
        try:
            completion = _parse_completion(await _json(http), topology)
        except ApiError as exc:
            metrics.requests.labels(worker.id, "refused").inc()
            return exc.response()
        request = completion.request
        sequence, queue = node.submit(request)
        header = {
            "id": f"cmpl-{request.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model.name,
        }
        tokens = node.tokens(sequence, queue)
        if completion.stream:

            async def chunks() -> AsyncIterator[bytes]:
                async for emitted in tokens:
                    body = {**header, "choices": [_choice(emitted)]}
                    if emitted.last:
                        record(sequence, completion.claimed_tokens)
                        body["usage"] = usage(sequence)
                        body["kvc"] = kvc_extension(sequence, completion.origin_region)
                    yield b"data: " + json.dumps(body).encode() + b"\n\n"
                if sequence.aborted:
                    error = {"message": "the worker was reset", "type": "server_error"}
                    yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        text = "".join(
            [token_text(output_token(request.request_id, e.index)) async for e in tokens]
        )
        if sequence.aborted:
            metrics.requests.labels(worker.id, "aborted").inc()
            return ApiError(503, "the worker was reset", "reset", "server_error").response()
        record(sequence, completion.claimed_tokens)
        body = {
            **header,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": usage(sequence),
            "kvc": kvc_extension(sequence, completion.origin_region),
        }
        return JSONResponse(body)

    async def migrate(http: HttpRequest) -> Response:
        try:
            namespace, tokens, mode = _parse_migration(await _json(http), topology, worker.region)
        except ApiError as exc:
            return exc.response()
        node.migrate(namespace, tokens, mode)
        return JSONResponse({"status": "accepted", "worker": worker.id}, status_code=202)

    async def reset(http: HttpRequest) -> Response:
        # {"publish_evictions": false} loses the evictions (fault injection: the index
        # keeps claiming this worker's old prefixes); the default publishes them.
        raw = await http.body()
        try:
            options = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return ApiError(400, "the body must be JSON", "invalid_json").response()
        publish = options.get("publish_evictions", True) if isinstance(options, dict) else None
        if not isinstance(publish, bool):
            message = "publish_evictions must be true or false"
            return ApiError(400, message, "invalid_reset").response()
        node.reset(publish_evictions=publish)
        await deliver()  # "done" means the index will hear of the evicts
        return JSONResponse({"status": "reset", "worker": worker.id, "published": publish})

    async def healthz(http: HttpRequest) -> Response:
        return JSONResponse({"service": "worker", "worker": worker.id})

    async def readyz(http: HttpRequest) -> Response:
        report = health.report()
        failing = {n: c.detail for n, c in report.items() if not c.ok}
        ready = health.ready()
        return JSONResponse({"ready": ready, "failing": failing}, status_code=200 if ready else 503)

    async def metrics_endpoint(http: HttpRequest) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/migrate", migrate, methods=["POST"]),
            Route("/admin/reset", reset, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
        ]
    )


def _choice(emitted: Emitted) -> dict[str, Any]:
    request_id = emitted.sequence.request.request_id
    return {
        "index": 0,
        "text": token_text(output_token(request_id, emitted.index)),
        "logprobs": None,
        "finish_reason": "length" if emitted.last else None,
    }


async def _json(http: HttpRequest) -> Mapping[str, Any]:
    try:
        body = json.loads(await http.body())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_json")
    return body


def _parse_completion(body: Mapping[str, Any], topology: Topology) -> _Completion:
    model = topology.model
    if body.get("model") != model.name:
        raise ApiError(
            404, f"model {body.get('model')!r} is not served here (only {model.name!r})",
            "model_not_found",
        )  # fmt: skip
    raw_max = body.get("max_tokens")
    max_tokens = 16 if raw_max is None else _int(raw_max, "max_tokens", 1, model.context_tokens)
    tokens = _tokens(body.get("prompt"), "prompt")
    if len(tokens) + max_tokens > model.context_tokens:
        raise ApiError(
            400, f"prompt ({len(tokens)} tokens) + max_tokens ({max_tokens}) exceeds the "
            f"context of {model.context_tokens} tokens", "context_length_exceeded",
        )  # fmt: skip
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", "invalid_stream")
    kvc = body.get("kvc") or {}
    if not isinstance(kvc, dict):
        raise ApiError(400, "kvc must be an object", "invalid_kvc")
    request_id = kvc.get("request_id") or uuid.uuid4().hex
    origin = kvc.get("origin_region")
    if origin is not None:
        try:
            topology.region(str(origin))
        except KeyError:
            raise ApiError(400, f"kvc.origin_region {origin!r} is unknown", "invalid_kvc") from None
    return _Completion(
        Request(str(request_id), _namespace(kvc.get("namespace"), topology), tokens, max_tokens),
        stream,
        _int(kvc.get("claimed_tokens", 0), "kvc.claimed_tokens", 0, _TOKEN_LIMIT),
        None if origin is None else str(origin),
    )


def _parse_migration(
    body: Mapping[str, Any], topology: Topology, region: str
) -> tuple[Namespace, np.ndarray[Any, np.dtype[np.uint32]], MigrationMode]:
    tokens = _tokens(body.get("prompt"), "prompt")
    try:
        mode = MigrationMode(body.get("mode", "recompute"))
    except ValueError:
        raise ApiError(400, "mode must be 'recompute' or 'copy'", "invalid_mode") from None
    source = body.get("source")
    if mode is MigrationMode.COPY:
        peer = next((w for w in topology.workers if w.id == source), None)
        if peer is None or peer.region != region:
            raise ApiError(
                400, f"a copy needs a source worker of region {region!r}, got {source!r}",
                "invalid_source",
            )  # fmt: skip
    return _namespace(body.get("namespace"), topology), tokens, mode


def _namespace(group: object, topology: Topology) -> Namespace:
    if group is None or group == "":
        return Namespace(topology.model.name)
    if not isinstance(group, str):
        raise ApiError(400, "namespace must be a string", "invalid_namespace")
    return Namespace(topology.model.name, group)


def _tokens(value: object, name: str) -> np.ndarray[Any, np.dtype[np.uint32]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{name} must be a non-empty list of token ids", "invalid_prompt")
    if not all(type(t) is int and 0 <= t < _TOKEN_LIMIT for t in value):
        raise ApiError(
            400, f"{name} holds a token id that is not an int in [0, 2^32)", "invalid_prompt"
        )
    return np.array(value, dtype=np.uint32)


def _int(value: object, name: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ApiError(
            400, f"{name} must be an integer in [{low}, {high}], got {value!r}", "invalid_value"
        )
    return value
