"""Per-region summaries of a run's records, and a table of several runs side by side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvcompass.loadgen.records import RequestRecord

__all__ = ["RegionSummary", "RunSummary", "failures", "render_side_by_side", "summarize"]

ALL = "all"


@dataclass(frozen=True)
class RegionSummary:
    """One origin region's requests (or every region's, ``region == "all"``).

    Latency percentiles are over successful requests (None without any, or for TTFT
    without streaming); throughput is successful requests (and generated tokens) per
    second of the run. Reused tokens are what workers reported reusing; recomputed =
    prompt tokens − reused, over successful requests. ``cross_region``: successful
    requests served by a worker outside the origin region.
    """

    region: str
    requests: int
    ok: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    reused_tokens: int
    recomputed_tokens: int
    cross_region: int

    @property
    def reuse_ratio(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class RunSummary:
    name: str
    duration_s: float
    regions: tuple[RegionSummary, ...]  # origin regions in the given order, then "all"

    def region(self, name: str) -> RegionSummary:
        return next(r for r in self.regions if r.region == name)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _summarize(region: str, records: list[RequestRecord], duration_s: float) -> RegionSummary:
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    reused = sum(r.reused_tokens or 0 for r in ok)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return RegionSummary(
        region=region,
        requests=len(records),
        ok=len(ok),
        errors=len(records) - len(ok),
        ttft_p50_ms=_pct(ttft, 50),
        ttft_p99_ms=_pct(ttft, 99),
        e2e_p50_ms=_pct(e2e, 50),
        e2e_p99_ms=_pct(e2e, 99),
        requests_per_s=len(ok) * per_s,
        output_tokens_per_s=sum(r.completion_tokens or 0 for r in ok) * per_s,
        prompt_tokens=prompt,
        reused_tokens=reused,
        recomputed_tokens=prompt - reused,
        cross_region=sum(1 for r in ok if r.cross_region),
    )


def summarize(
    name: str,
    records: Iterable[RequestRecord],
    duration_s: float,
    regions: Sequence[str] = (),
) -> RunSummary:
    """Per origin region (``regions`` first, in that order, then any others seen), and
    ``all``. ``duration_s``: the run's length, for the throughputs."""
    records = list(records)
    order = list(regions) + sorted({r.origin for r in records} - set(regions))
    rows = [_summarize(g, [r for r in records if r.origin == g], duration_s) for g in order]
    rows.append(_summarize(ALL, records, duration_s))
    return RunSummary(name, duration_s, tuple(rows))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


_ROWS: tuple[tuple[str, str], ...] = (
    ("requests (errors)", "requests"),
    ("TTFT P50 / P99 ms", "ttft"),
    ("E2E P50 / P99 ms", "e2e"),
    ("throughput req/s", "rps"),
    ("output tokens/s", "tps"),
    ("prefill reused / recomputed", "tokens"),
    ("reused share", "share"),
    ("cross-region forwards", "cross"),
)


def _cell(s: RegionSummary, what: str) -> str:
    match what:
        case "requests":
            return f"{s.requests} ({s.errors})"
        case "ttft":
            return f"{_ms(s.ttft_p50_ms)} / {_ms(s.ttft_p99_ms)}"
        case "e2e":
            return f"{_ms(s.e2e_p50_ms)} / {_ms(s.e2e_p99_ms)}"
        case "rps":
            return f"{s.requests_per_s:.2f}"
        case "tps":
            return f"{s.output_tokens_per_s:,.0f}"
        case "tokens":
            return f"{s.reused_tokens:,} / {s.recomputed_tokens:,}"
        case "share":
            return f"{s.reuse_ratio:.1%}"
        case _:
            return f"{s.cross_region}"


def render_side_by_side(runs: Sequence[RunSummary]) -> str:
    """A text table: one block of rows per region, one column per run."""
    if not runs:
        return ""
    regions = list(dict.fromkeys(r.region for run in runs for r in run.regions))
    header = ["region", "metric", *(run.name for run in runs)]
    table = [header]
    for region in regions:
        for i, (label, what) in enumerate(_ROWS):
            cells = []
            for run in runs:
                found = next((r for r in run.regions if r.region == region), None)
                cells.append("-" if found is None else _cell(found, what))
            table.append([region if i == 0 else "", label, *cells])
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = []
    for n, line in enumerate(table):
        left = [line[0].ljust(widths[0]), line[1].ljust(widths[1])]
        right = [cell.rjust(w) for cell, w in zip(line[2:], widths[2:], strict=True)]
        lines.append("  ".join(left + right).rstrip())
        if n == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def failures(records: Sequence[RequestRecord], shown: int = 3) -> str | None:
    """One line on the failed requests: how many, and their commonest errors with counts
    (the table counts errors; this says what they were). None when none failed."""
    errors = Counter(r.error or f"HTTP {r.status}" for r in records if not r.ok)
    if not errors:
        return None
    top = "; ".join(f"{n} × {error}" for error, n in errors.most_common(shown))
    more = f"; {len(errors) - shown} other errors" if len(errors) > shown else ""
    return f"{errors.total()} of {len(records)} requests failed: {top}{more}"
