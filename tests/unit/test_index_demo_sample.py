"""``kvcompass index-demo`` keeps an evenly spaced sample of its prompts for the lookup
timing, not every prompt: at ~27 KB a prompt, ten million entries needed ~31 GB."""

from __future__ import annotations

import numpy as np
import pytest

from kvcompass.loadgen import index_demo
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")


def test_the_prompts_kept_are_every_stride_th_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    tables, every, n_all, entries = index_demo._synthetic_entries(TOPOLOGY, 3000, seed=3)
    assert len(every) == n_all > 40  # under a large sample nothing is dropped
    monkeypatch.setattr(index_demo, "LATENCY_SAMPLE", 5)
    small_tables, kept, n_prompts, small_entries = index_demo._synthetic_entries(
        TOPOLOGY, 3000, seed=3
    )
    assert (n_prompts, small_entries, small_tables) == (n_all, entries, tables)
    assert 5 <= len(kept) < 10
    stride = next(s for s in (1, 2, 4, 8, 16, 32, 64) if len(every[::s]) == len(kept))
    assert stride > 1
    for got, want in zip(kept, every[::stride], strict=True):
        np.testing.assert_array_equal(got, want)
