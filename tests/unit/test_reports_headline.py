"""``kvcompass report headline``: per load, each scheme's P99 TTFT and throughput over
KVCompass's in every seed, and the seeds in which KVCompass is best of all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcompass.loadgen.reports import headline
from kvcompass.loadgen.reports.cells import paper_cell, rates_of
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.reports.sweep import policies
from kvcompass.loadgen.sim.cell import Cell

RATE = rates_of(headline.SCALE.topology, [1.5])[0]


def _run(p99: float, throughput: float) -> Run:
    summary = {"ttft_p99_ms": p99, "throughput_req_per_s": throughput}
    return Run(summary, {}, {"ttft_ms": np.zeros(1)}, {})


def _runs() -> dict[Cell, Run]:
    """Seed 0: SkyWalker's P99 is lower than KVCompass's; seed 1: PlanetServe's
    throughput is higher. KVCompass's P99 differs by seed, so a ratio is per seed."""
    special = {(0, "skywalker"): (900.0, 90.0), (1, "planetserve"): (2000.0, 110.0)}
    runs = {}
    for seed in (0, 1):
        for policy in policies():
            ours = policy == "kvcompass"
            mine = (1000.0 + seed * 250, 100.0) if ours else (2000.0 + seed * 200, 90.0)
            runs[paper_cell(policy, RATE, seed, topology=headline.SCALE.topology)] = _run(
                *special.get((seed, policy), mine)
            )
    return runs


def test_ratios_per_seed_and_the_seeds_where_kvcompass_is_best_of_all() -> None:
    rows, best = headline.tabulate(_runs())
    by_policy = {r["policy"]: r for r in rows}
    assert [r["policy"] for r in rows] == list(policies())
    assert {r["load"] for r in rows} == {1.5}
    assert {r["seeds"] for r in rows} == {2}

    sky = by_policy["skywalker"]
    assert sky["p99_over_kvc_min"] == pytest.approx(0.9)
    assert sky["p99_over_kvc_max"] == pytest.approx(2200 / 1250)
    assert sky["p99_over_kvc"] == pytest.approx((0.9 + 2200 / 1250) / 2)
    assert sky["kvc_p99_lower_in"] == 1
    assert sky["kvc_throughput_higher_in"] == 2
    assert sky["paper_p99_over_kvc"] == 6.2

    ps = by_policy["planetserve"]
    assert ps["kvc_p99_lower_in"] == 2
    assert ps["kvc_throughput_higher_in"] == 1
    assert ps["throughput_over_kvc"] == pytest.approx((0.9 + 1.1) / 2)

    ours = by_policy["kvcompass"]
    assert ours["p99_over_kvc"] == 1.0
    assert ours["kvc_p99_lower_in"] == ""
    assert best["1.5"]["kvcompass_lowest_p99_in"] == [1]
    assert best["1.5"]["kvcompass_highest_throughput_in"] == [0]


def test_the_report_writes_its_table_figure_and_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _runs()

    def fake_collect(cells: list[Cell], out: Path, jobs: int, runner: object) -> dict[Cell, Run]:
        return {c: runs[c] for c in cells}

    monkeypatch.setattr(headline, "collect", fake_collect)
    monkeypatch.setattr(headline, "sizes", lambda quick: ((1.5,), (0, 1), 2000))
    art = headline.run_headline(tmp_path, quick=True)
    assert len(art.rows) == len(policies())
    assert art.meta["by_load"]["1.5"]["kvcompass_lowest_p99_in"] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "headline.csv",
        "headline.json",
        "headline.png",
    ]
