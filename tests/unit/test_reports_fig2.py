"""Fig. 2's share of cross-region-only reusable prefixes on a hand-made trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvcompass.loadgen.reports.fig2 import TRACES, classify, run_fig2
from kvcompass.loadgen.reports.reuse import replay
from kvcompass.loadgen.workloads import TraceRecord

BLOCK = 512


class _ByTable:
    """Session → region from a table (the real shares draw regions by a keyed hash)."""

    regions = ("a", "b")

    def __init__(self, table: dict[int, str]) -> None:
        self.table = table

    def of_session(self, key: int, session: int) -> str:
        return self.table[session]


def _rec(ids: tuple[int, ...], length: int) -> TraceRecord:
    return TraceRecord(0.0, length, 1, ids)


# r0 opens in a: cold. r1 opens in b, shares 2 blocks (1024 tokens) only a has: remote-only.
# r2 opens in a and extends r0's prompt: local. r3 opens in b with 1 shared block: too
# short (cold). r4 is r1's next turn (b): local, but not a first turn.
RECORDS = [
    _rec((1, 2, 3), 3 * BLOCK),
    _rec((1, 2, 9), 3 * BLOCK),
    _rec((1, 2, 3, 4), 4 * BLOCK),
    _rec((1, 7), 2 * BLOCK),
    _rec((1, 2, 9, 10), 4 * BLOCK),
]
SESSIONS = [0, 1, 2, 3, 1]
REGIONS = _ByTable({0: "a", 1: "b", 2: "a", 3: "b"})


def test_replay_reports_each_regions_cached_prefix() -> None:
    arrivals = list(replay(RECORDS, SESSIONS, REGIONS, 0, BLOCK))
    assert arrivals[1].matched_tokens == {"a": 2 * BLOCK, "b": 0}
    assert arrivals[2].matched_tokens == {"a": 3 * BLOCK, "b": 2 * BLOCK}
    assert arrivals[4].matched_tokens == {"a": 2 * BLOCK, "b": 3 * BLOCK}
    assert [a.first_turn for a in arrivals] == [True, True, True, True, False]


def test_share_of_first_turns_cached_only_elsewhere() -> None:
    counts = classify(replay(RECORDS, SESSIONS, REGIONS, 0, BLOCK), min_tokens=1024)
    assert (counts.requests, counts.local, counts.remote_only) == (4, 1, 1)
    assert counts.remote_only_share == pytest.approx(0.5)
    # Token-weighted: remote-only 1024 of (1536 local + 1024 remote).
    assert counts.remote_only_token_share == pytest.approx(1024 / 2560)


def test_all_turns_count_follow_ups() -> None:
    counts = classify(
        replay(RECORDS, SESSIONS, REGIONS, 0, BLOCK), min_tokens=1024, first_turns_only=False
    )
    assert (counts.requests, counts.local, counts.remote_only) == (5, 2, 1)


def test_partial_last_block_is_not_cached() -> None:
    # 1.5 blocks: only block 5 is full, so a later prompt matches 512 tokens, not 1024.
    records = [_rec((5, 6), BLOCK + BLOCK // 2), _rec((5, 6, 8), 3 * BLOCK)]
    arrivals = list(replay(records, [0, 1], _ByTable({0: "a", 1: "b"}), 0, BLOCK))
    assert arrivals[1].matched_tokens["a"] == BLOCK


def test_run_writes_png_csv_json(tmp_path: Path) -> None:
    for name in TRACES:
        with gzip.open(tmp_path / name, "wt") as f:
            for r in RECORDS:
                row = {
                    "timestamp": 0,
                    "input_length": r.input_length,
                    "output_length": 1,
                    "hash_ids": list(r.hash_ids),
                }
                f.write(json.dumps(row) + "\n")
    out = tmp_path / "out"
    art = run_fig2(tmp_path, out, seeds=2, topology="testbed-3region")
    assert (out / "fig2.png").stat().st_size > 0
    header = (out / "fig2.csv").read_text().splitlines()[0].split(",")
    assert header == list(art.columns)
    assert len(art.rows) == 2 * len(TRACES)
