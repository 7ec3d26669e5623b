"""Fig. 12's and Fig. 16's cells: full size, and ``--quick`` cells long enough that the
throughput (what finishes inside the arrival window) is measured at all."""

from __future__ import annotations

from kvcompass.loadgen.reports import fig12
from kvcompass.loadgen.reports.cells import WORKLOADS


def test_full_cells_have_the_figures_request_counts() -> None:
    for scale in fig12.SCALES.values():
        assert {c.requests for c in fig12.cells(scale, False, WORKLOADS)} == {scale.requests}


def test_quick_cells_span_the_minimum_arrival_window_at_every_rate() -> None:
    for scale in fig12.SCALES.values():
        quick = fig12.cells(scale, True, WORKLOADS)
        for c in quick:
            assert c.requests is not None
            assert c.requests >= scale.quick_requests
            assert c.requests / c.rate >= fig12.QUICK_WINDOW_S
        assert all(c.requests is not None and c.requests < scale.requests for c in quick)
    # Fig. 12's lowest quick rate keeps the smallest size: 300 requests span the window.
    scale = fig12.SCALES["fig12"]
    assert min(c.requests or 0 for c in fig12.cells(scale, True, WORKLOADS)) == 300


def test_every_scale_runs_its_focus_rate_at_full_size_and_quick() -> None:
    # Figs. 13 and 14 read the focus-rate cells only: a grid without them draws nothing.
    for scale in fig12.SCALES.values():
        assert scale.focus in scale.loads
        assert scale.focus in scale.quick_loads
