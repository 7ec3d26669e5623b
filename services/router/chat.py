"""Worker completions as chat completions: workers serve ``/v1/completions`` only, so
the router renders chat requests with the template (tokenizer.chat_prompt) and turns
the answers back into ``chat.completion`` objects and ``chat.completion.chunk`` events."""

from __future__ import annotations

from typing import Any

__all__ = ["chat_chunk", "chat_completion"]


def _choice_text(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def chat_completion(body: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {
            "index": c.get("index", i),
            "message": {"role": "assistant", "content": _choice_text(c)},
            "finish_reason": c.get("finish_reason"),
        }
        for i, c in enumerate(body.get("choices") or [])
    ]
    return {**body, "object": "chat.completion", "choices": choices}


def chat_chunk(body: dict[str, Any], first: bool) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(body.get("choices") or []):
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if text := _choice_text(c):
            delta["content"] = text
        choices.append(
            {"index": c.get("index", i), "delta": delta, "finish_reason": c.get("finish_reason")}
        )
    return {**body, "object": "chat.completion.chunk", "choices": choices}
