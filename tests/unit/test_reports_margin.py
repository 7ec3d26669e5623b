"""``kvcompass report margin``: KVCompass at each remote margin against the best other
scheme of each seed."""

from __future__ import annotations

import numpy as np
import pytest

from kvcompass.loadgen.reports import headline, margin
from kvcompass.loadgen.reports.cells import paper_cell, rates_of
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import policies
from kvcompass.loadgen.sim.cell import Cell

TOPOLOGY = headline.SCALE.topology
RATE = rates_of(TOPOLOGY, [1.0])[0]


def _run(p99: float, throughput: float, cross: float = 0.0) -> Run:
    summary = {
        "ttft_p99_ms": p99,
        "throughput_req_per_s": throughput,
        "cross_region_share": cross,
        "reuse_share": 0.4,
        "peak_load_factor": 1.1,
    }
    return Run(summary, {}, {"ttft_ms": np.zeros(1)}, {})


def _runs() -> dict[Cell, Run]:
    """Per seed, the best other scheme is SkyWalker on P99 (1000, 1100) and PlanetServe on
    throughput (100, 110); the rest are worse. KVCompass: 1050 / 1050 ms and 105 / 105
    req/s at margin 0, 950 / 1200 ms and 99 / 111 at margin 1."""
    runs = {}
    for seed, (sky, ps) in enumerate(((1000.0, 100.0), (1100.0, 110.0))):
        for policy in policies():
            if policy == headline.OURS:
                continue
            p99 = sky if policy == "skywalker" else 5000.0
            thr = ps if policy == "planetserve" else 50.0
            runs[paper_cell(policy, RATE, seed, topology=TOPOLOGY)] = _run(p99, thr)
        mine = {0.0: (1050.0, 105.0, 0.3), 1.0: ((950.0, 1200.0)[seed], (99.0, 111.0)[seed], 0.1)}
        for m, (p99, thr, cross) in mine.items():
            cell = paper_cell(headline.OURS, RATE, seed, topology=TOPOLOGY, remote_margin_rtt=m)
            runs[cell] = _run(p99, thr, cross)
    return runs


def test_each_margin_against_the_best_other_scheme_of_each_seed() -> None:
    rows = {r["margin_rtt"]: r for r in margin.tabulate(_runs())}
    assert sorted(rows) == [0.0, 1.0]
    paper, one = rows[0.0], rows[1.0]
    assert paper["load"] == 1.0
    assert paper["seeds"] == 2
    assert paper["lowest_p99_in"] == 1  # 1050 > 1000 in seed 0, < 1100 in seed 1
    assert paper["p99_over_best_other"] == pytest.approx((1050 / 1000 + 1050 / 1100) / 2)
    assert paper["highest_throughput_in"] == 1  # 105 > 100, < 110
    assert one["lowest_p99_in"] == 1  # 950 < 1000, 1200 > 1100
    assert one["p99_over_best_other"] == pytest.approx((950 / 1000 + 1200 / 1100) / 2)
    assert one["highest_throughput_in"] == 1  # 99 < 100, 111 > 110
    assert one["throughput_over_best_other"] == pytest.approx((99 / 100 + 111 / 110) / 2)
    assert one["cross_region_share"] == pytest.approx(0.1)
    assert one["ttft_p99_ms"] == pytest.approx(1075.0)


def test_cells_add_kvcompass_at_each_nonzero_margin_to_the_headline_cells() -> None:
    grid = margin.cells(quick=True)
    extra = [c for c in grid if c not in set(headline.cells(quick=True))]
    assert {c.remote_margin_rtt for c in extra} == {1.0}
    assert {c.policy for c in extra} == {headline.OURS}
    assert len(extra) == len(headline.sizes(True)[0]) * len(headline.sizes(True)[1])
