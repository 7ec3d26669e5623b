"""Mooncake traces (``../shared/traces/README.md``) as live requests.

A record has an arrival time, input and output lengths and ``hash_ids``: one id per
block of ``block_size`` (512) tokens, chained, so equal ids mean an equal prefix up to
and including that block. Each id becomes ``block_size`` token ids from a keyed hash of
(id, position): equal id prefixes give equal token prefixes, and different ids differ.
A prompt is its blocks' tokens cut to ``input_length`` (the last block may be partial).

Sessions (the trace has none) are recovered as conversations: a request continues the
session of the latest earlier request whose full blocks are all a prefix of its own (a
next turn repeats the whole previous prompt). A shared prefix alone (a system prompt,
a document several users ask about) does not join sessions, so such prefixes are
requested from several regions, as they would be. Blocks present in at least half of
all records (the conversation trace's block 0, a universal 512-token system prompt) are
ignored for this. Each session's region and tenant are keyed draws over the seed.
"""

from __future__ import annotations

import gzip
import json
import lzma
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kvcompass.loadgen.workloads.arrivals import poisson_times, scaled_times
from kvcompass.loadgen.workloads.draws import token_array
from kvcompass.loadgen.workloads.keyed import block_tokens, keyed_uniform
from kvcompass.loadgen.workloads.regions import RegionShares
from kvcompass.loadgen.workloads.request import LiveRequest

__all__ = ["TraceConfig", "TraceRecord", "TraceWorkload", "read_trace", "trace_sessions"]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Records of a Mooncake JSONL trace (plain, .gz or .xz), in file order."""
    path = Path(path)
    records: list[TraceRecord] = []
    with _open_text(path) as stream:
        for number, line in enumerate(stream, 1):
            if limit is not None and len(records) >= limit:
                break
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                records.append(
                    TraceRecord(
                        float(raw["timestamp"]),
                        int(raw["input_length"]),
                        int(raw["output_length"]),
                        tuple(int(h) for h in raw["hash_ids"]),
                    )
                )
            except (ValueError, TypeError, KeyError) as exc:
                what = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise ValueError(
                    f"{path}:{number}: not a Mooncake trace record ({what}); each line is a "
                    "JSON object with timestamp, input_length, output_length and hash_ids"
                ) from None
    return records


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt")
    if path.suffix == ".xz":
        return lzma.open(path, "rt")
    return open(path)


@dataclass(frozen=True)
class TraceConfig:
    """How a trace is replayed.

    - ``seed``: keys the token hash, the regions and the tenants (one seed, one replay).
    - ``block_size``: tokens per trace block (512 for both Mooncake traces).
    - ``vocab``: token ids are drawn from [0, vocab).
    - ``speed``: trace time divided by this (2.0 = twice as fast).
    - ``rate``: if set, Poisson arrivals at this many requests/s replace the timestamps.
    - ``region_weights``: population share per region in topology order; empty = the
      regions' worker counts.
    - ``tenants``: tenant names; each session belongs to one (keyed draw, equal shares).
    - ``max_prompt_tokens`` / ``max_output_tokens``: caps (a cut prompt keeps its
      prefix, so sharing is preserved); None = the trace's lengths.
    - ``skip``: records skipped from the start of the trace (times restart at 0).
    """

    seed: int = 0
    block_size: int = 512
    vocab: int = 128_000
    speed: float = 1.0
    rate: float | None = None
    region_weights: tuple[float, ...] = ()
    tenants: tuple[str, ...] = ("default",)
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    skip: int = 0


def trace_sessions(records: Sequence[TraceRecord], block_size: int) -> list[int]:
    """The session number of each record (see the module docstring)."""
    counts: dict[int, int] = {}
    for record in records:
        for block in set(record.hash_ids):
            counts[block] = counts.get(block, 0) + 1
    common = {b for b, n in counts.items() if 2 * n >= len(records)}
    ends: dict[int, int] = {}  # last full block of a request → its session
    sessions: list[int] = []
    for record in records:
        session = -1
        for block in reversed(record.hash_ids):
            if block in common:
                break
            if block in ends:
                session = ends[block]
                break
        if session < 0:
            session = len(sessions)  # numbered by the record that opened it
        sessions.append(session)
        full = record.input_length // block_size
        if full and record.hash_ids[full - 1] not in common:
            ends[record.hash_ids[full - 1]] = session
    return sessions


class TraceWorkload:
    """Live requests from trace records (arrival order = file order)."""

    def __init__(
        self, records: Sequence[TraceRecord], shares: RegionShares, config: TraceConfig
    ) -> None:
        if not config.tenants:
            raise ValueError("at least one tenant")
        self.records = list(records[config.skip :])
        self.shares = shares
        self.config = config
        self.sessions = trace_sessions(self.records, config.block_size)

    def tokens(self, record: TraceRecord) -> array[int]:
        c = self.config
        length = record.input_length
        if c.max_prompt_tokens is not None:
            length = min(length, c.max_prompt_tokens)
        blocks = -(-length // c.block_size)
        ids = record.hash_ids[:blocks]
        return token_array(block_tokens(c.seed, ids, c.block_size, c.vocab)[:length])

    def requests(self) -> Iterator[LiveRequest]:
        c = self.config
        times = (
            poisson_times(c.rate, c.seed)
            if c.rate is not None
            else scaled_times((r.timestamp_ms for r in self.records), c.speed)
        )
        for i, (record, at_s) in enumerate(zip(self.records, times, strict=False)):
            session = self.sessions[i]
            tenant = c.tenants[int(keyed_uniform(c.seed ^ 0x7E4A47, session) * len(c.tenants))]
            max_tokens = max(1, record.output_length)
            if c.max_output_tokens is not None:
                max_tokens = min(max_tokens, c.max_output_tokens)
            yield LiveRequest(
                at_s=at_s,
                origin_region=self.shares.of_session(c.seed, session),
                tenant=tenant,
                tokens=self.tokens(record),
                max_tokens=max_tokens,
                session=f"t{session}",
                request_id=f"t{i + c.skip:06d}",
            )
