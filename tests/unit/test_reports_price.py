"""``kvcompass report price``: KVCompass with the router's other settings at each capacity
price, counted against the best other scheme at every point of ``shipped-grid``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kvcompass.loadgen.reports import price, shipped_grid
from kvcompass.loadgen.reports.cells import paper_cell, rates_of
from kvcompass.loadgen.reports.runs import Run
from kvcompass.loadgen.sim.cell import Cell
from kvcompass.routing import PAPER_PRICE, RoutingConfig

TOPOLOGY = "sim-8region"
LOW, HIGH = rates_of(TOPOLOGY, [0.5, 1.0], "wildchat")
SHIPPED = (RoutingConfig.tau_ms, RoutingConfig.lambda_max)
PAPER = (PAPER_PRICE["tau_ms"], PAPER_PRICE["lambda_max"])


def _run(p99: float, throughput: float) -> Run:
    summary = {"ttft_p99_ms": p99, "throughput_req_per_s": throughput}
    return Run(summary, {}, {"ttft_ms": np.zeros(1)}, {})


def _cell(policy: str, rate: float, **knobs: Any) -> Cell:
    return paper_cell(policy, rate, topology=TOPOLOGY, workload="wildchat", **knobs)


def _ours(rate: float, tau_ms: float, lambda_max: float) -> Cell:
    knobs = shipped_grid.SHIPPED | {"tau_ms": tau_ms, "lambda_max": lambda_max}
    return _cell("kvcompass", rate, **knobs)


def test_each_price_is_counted_against_the_best_other_scheme_at_every_point() -> None:
    runs = {
        _cell("skywalker", LOW): _run(600.0, 90.0),
        _cell("dynamo", LOW): _run(700.0, 100.0),
        _cell("skywalker", HIGH): _run(800.0, 150.0),
        # The paper's KVCompass (paper cells) is neither price's row.
        _cell("kvcompass", LOW): _run(1.0, 1e6),
        _ours(LOW, *SHIPPED): _run(550.0, 101.0),
        _ours(HIGH, *SHIPPED): _run(810.0, 160.0),
        _ours(LOW, *PAPER): _run(650.0, 99.0),
        _ours(HIGH, *PAPER): _run(700.0, 140.0),
        # Another margin at the paper's price: not the router's other settings.
        replace(_ours(HIGH, *PAPER), remote_margin_rtt=2.5): _run(1.0, 1e6),
    }
    paper, shipped = price.tabulate(runs)
    assert (paper["tau_ms"], paper["lambda_max"], paper["shipped"]) == (*PAPER, False)
    assert (shipped["tau_ms"], shipped["lambda_max"], shipped["shipped"]) == (*SHIPPED, True)
    assert (paper["points"], paper["lowest_p99"], paper["highest_throughput"]) == (2, 1, 0)
    assert (shipped["points"], shipped["lowest_p99"], shipped["highest_throughput"]) == (2, 1, 2)
    assert shipped["median_p99_over_best_other"] == round(
        float(np.median([550 / 600, 810 / 800])), 4
    )


def test_a_point_where_nothing_finished_in_the_window_gives_no_throughput_ratio() -> None:
    # --quick cells at high rates can end their arrival window before any request ends.
    runs = {
        _cell("skywalker", LOW): _run(600.0, 0.0),
        _ours(LOW, *SHIPPED): _run(550.0, 0.0),
        _cell("skywalker", HIGH): _run(800.0, 150.0),
        _ours(HIGH, *SHIPPED): _run(810.0, 165.0),
    }
    (shipped,) = price.tabulate(runs)
    assert (shipped["points"], shipped["lowest_p99"], shipped["highest_throughput"]) == (2, 1, 1)
    assert shipped["median_req_per_s_over_best_other"] == round(165 / 150, 4)
    assert shipped["median_p99_over_best_other"] == round(
        float(np.median([550 / 600, 810 / 800])), 4
    )


def test_cells_add_each_other_price_to_shipped_grid() -> None:
    grid = price.cells(quick=True)
    base = shipped_grid.cells(quick=True)
    extra = [c for c in grid if c not in set(base)]
    shipped = [c for c in base if c.policy == "kvcompass" and c.tau_ms == SHIPPED[0]]
    assert extra
    assert len(extra) == len(shipped) * (len(price.prices(quick=True)) - 1)
    assert {(c.tau_ms, c.lambda_max) for c in extra} == {PAPER}
    for c in extra:
        assert c.policy == "kvcompass"
        assert (c.remote_margin_rtt, c.pending_credit, c.prefix_chain) == (
            RoutingConfig.remote_margin_rtt,
            RoutingConfig.pending_credit,
            RoutingConfig.prefix_chain,
        )
    assert len(price.prices(quick=False)) == len(price.PRICES)
    assert SHIPPED in price.PRICES
    assert PAPER in price.PRICES
