"""One record per request the load generator sent, and their JSONL files."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["RequestRecord", "read_records", "write_record"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request.

    Times are milliseconds from sending (``ttft_ms``: first SSE data chunk, streaming
    only; ``e2e_ms``: last byte). ``worker``/``region``/``reason``/``claimed_tokens``
    come from the router's ``x-kvc-*`` headers, ``reused_tokens`` from
    ``usage.prompt_tokens_details.cached_tokens``. ``status`` is the HTTP status (0: no
    response); ``error`` is set for every failed request. ``late_ms``: how far behind its
    scheduled time it was sent (the generator keeping up, or not).
    """

    request_id: str
    session: str
    origin: str
    tenant: str
    scheduled_s: float
    late_ms: float
    prompt_tokens: int
    max_tokens: int
    status: int = 0
    error: str | None = None
    worker: str | None = None
    region: str | None = None
    reason: str | None = None
    claimed_tokens: int | None = None
    reused_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def cross_region(self) -> bool:
        return self.region is not None and self.region != self.origin

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))


def write_record(out: IO[str], record: RequestRecord) -> None:
    out.write(record.to_json() + "\n")


def read_records(path: str | Path) -> Iterator[RequestRecord]:
    """The records of a load generator's JSONL file; ValueError naming the file and
    line if one is not a record (fields it does not know are ignored)."""
    names = {f.name for f in dataclasses.fields(RequestRecord)}
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                yield RequestRecord(**{k: v for k, v in raw.items() if k in names})
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{number}: not a request record ({exc})") from None
