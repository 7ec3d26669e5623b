"""The OpenAI-compatible request bodies the router accepts, and its error bodies.

Parsing turns a client body into a :class:`CompletionRequest` (token ids, the fields to
forward) or raises :class:`ApiError`, which the app renders as
``{"error": {"message", "type", "code", "param"}}`` with its HTTP status:

- 400: not JSON, not an object, a missing or mistyped field, an empty prompt, a batch;
- 404: a model other than the topology's;
- 413: a prompt longer than the model's context, or a body over ``KVC_MAX_BODY_BYTES``;
- 422: token ids outside 0..2^32-1, ``max_tokens`` below 1 or above the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from kvcompass.services.router.tokenizer import ChatMessage, Tokenizer, chat_prompt

__all__ = ["ApiError", "CompletionRequest", "parse_chat", "parse_completion", "parse_json"]

_U32 = 1 << 32
DEFAULT_MAX_TOKENS = 16  # the worker's default too


class ApiError(Exception):
    """A request the router refuses, or a failure it reports, as an OpenAI error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        type: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A parsed request: the prompt's token ids and what the worker gets besides."""

    tokens: NDArray[np.uint32]
    max_tokens: int
    stream: bool
    chat: bool
    extra: dict[str, Any]  # the client's other fields (temperature, ...), forwarded as is


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return body


def _bad(message: str, param: str, status: int = 400, code: str = "invalid_value") -> ApiError:
    return ApiError(status, message, code=code, param=param)


def _common(
    body: dict[str, Any], model: str, context_tokens: int
) -> tuple[int, bool, dict[str, Any]]:
    name = body.get("model")
    if not isinstance(name, str):
        raise _bad("'model' is required and must be a string", "model")
    if name != model:
        raise ApiError(
            404,
            f"the model {name!r} does not exist; this router serves {model!r}",
            code="model_not_found",
            param="model",
        )
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise _bad("'max_tokens' must be an integer", "max_tokens")
    if not 1 <= max_tokens <= context_tokens:
        raise _bad(
            f"'max_tokens' must be between 1 and {context_tokens}, got {max_tokens}",
            "max_tokens",
            422,
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    extra = {k: v for k, v in body.items() if k not in ("prompt", "messages", "kvc")}
    extra["max_tokens"] = max_tokens
    return max_tokens, stream, extra


def _checked_ids(prompt: list[Any]) -> NDArray[np.uint32]:
    # The common case in C: only ints, all in range (a 1K-token prompt in ~50 µs).
    if prompt and set(map(type, prompt)) == {int}:
        ids = np.asarray(prompt)
        if ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < _U32:
            return ids.astype(np.uint32)
    if any(isinstance(p, str | list) for p in prompt):
        raise _bad("batched prompts are not supported: send one per request", "prompt")
    for i, t in enumerate(prompt):  # find the culprit for the message
        if not isinstance(t, int) or isinstance(t, bool):
            raise _bad(f"prompt[{i}] is {type(t).__name__}, not a token id", "prompt")
        if not 0 <= t < _U32:
            raise _bad(f"prompt[{i}] = {t} is not a token id (0..2^32-1)", "prompt", 422)
    return np.asarray(prompt, dtype=np.uint32)


def _sized(tokens: NDArray[np.uint32], context_tokens: int, param: str) -> NDArray[np.uint32]:
    if not len(tokens):
        raise _bad("the prompt is empty", param, code="empty_prompt")
    if len(tokens) > context_tokens:
        raise _bad(
            f"the prompt has {len(tokens)} tokens; the model's context is {context_tokens}",
            param,
            413,
            "context_length_exceeded",
        )
    return tokens


def parse_completion(
    body: dict[str, Any], model: str, context_tokens: int, tokenizer: Tokenizer
) -> CompletionRequest:
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids (a list
    holding exactly one of those is accepted too; batches are refused)."""
    max_tokens, stream, extra = _common(body, model, context_tokens)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = np.asarray(tokenizer.encode(prompt), dtype=np.uint32)
    elif isinstance(prompt, list):
        tokens = _checked_ids(prompt)
    else:
        raise _bad("'prompt' is required: a string or a list of token ids", "prompt")
    return CompletionRequest(
        _sized(tokens, context_tokens, "prompt"), max_tokens, stream, False, extra
    )


def _messages(raw: object) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' is required: a non-empty list", "messages")
    out: list[ChatMessage] = []
    for i, m in enumerate(raw):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: only text parts carry a prompt
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            content = "".join(p for p in parts if isinstance(p, str)) if parts else None
        if not isinstance(role, str) or not isinstance(content, str):
            raise _bad(f"messages[{i}] needs a string 'role' and text 'content'", "messages")
        out.append((role, content))
    return out


def parse_chat(
    body: dict[str, Any], model: str, context_tokens: int, tokenizer: Tokenizer
) -> CompletionRequest:
    """``POST /v1/chat/completions``: ``messages`` rendered by :func:`chat_prompt`."""
    max_tokens, stream, extra = _common(body, model, context_tokens)
    text = chat_prompt(_messages(body.get("messages")))
    tokens = np.asarray(tokenizer.encode(text), dtype=np.uint32)
    return CompletionRequest(
        _sized(tokens, context_tokens, "messages"), max_tokens, stream, True, extra
    )
