"""Each simulator-based report, fed hand-made run folders, writes a PNG and its CSV."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.fig9 import run_fig9
from kvcompass.loadgen.reports.fig12 import run_fig12
from kvcompass.loadgen.reports.fig13 import run_fig13
from kvcompass.loadgen.reports.fig14 import peak_load_factor, run_fig14
from kvcompass.loadgen.reports.fig15 import run_fig15
from kvcompass.loadgen.reports.peak import oracle_curve, peak_split, run_peak, tabulate
from kvcompass.loadgen.reports.run_length import run_run_length
from kvcompass.loadgen.reports.runs import Run, load_run
from kvcompass.loadgen.reports.shipped_grid import run_shipped_grid
from kvcompass.loadgen.reports.table4 import run_table4
from kvcompass.loadgen.sim import LoadSample, SimRecord, SimResult
from kvcompass.loadgen.sim.cell import Cell


def fake_run(cell: Cell, folder: Path) -> None:
    """A small, deterministic hand-made :class:`SimResult` for the cell, written as the
    simulator writes it."""
    rng = np.random.default_rng(sum(map(ord, cell.key)))
    workers = [f"w{i}" for i in range(4)]
    records = []
    for i in range(40):
        prompt = int(rng.integers(100, 4000))
        reused = int(rng.integers(0, prompt))
        ttft = float(rng.exponential(100))
        records.append(
            SimRecord(
                request_id=f"r{i}",
                session="s",
                tenant="t",
                origin="a",
                policy=cell.policy,
                worker=workers[i % 4],
                worker_region="a",
                arrival_s=i / cell.rate,
                prompt_tokens=prompt,
                output_tokens=20,
                matched_tokens=reused + int(rng.integers(0, 2)) * 64,
                reused_tokens=reused,
                dram_tokens=0,
                lookup_ms=0.0,
                wan_ms=10.0,
                queue_ms=float(rng.exponential(5)),
                prefill_ms=float(rng.exponential(30)),
                reload_ms=0.0,
                ttft_ms=ttft,
                e2e_ms=ttft + 200,
                reason="score",
            )
        )
    samples = [
        LoadSample(float(t), w, 1.0, 1, 0.5 + 0.5 * k)
        for t in range(5)
        for k, w in enumerate(workers)
    ]
    SimResult(records, samples, {"policy": cell.policy}, wall_s=0.1).write(folder)


Report = Callable[..., Artefact]


@pytest.mark.parametrize(
    ("report", "name"),
    [
        (run_fig9, "fig9"),
        (run_fig12, "fig12"),
        (run_fig13, "fig13"),
        (run_fig14, "fig14"),
        (run_fig15, "fig15"),
        (run_peak, "peak"),
        (run_table4, "table4"),
        (run_shipped_grid, "shipped-grid"),
        (run_run_length, "run-length"),
    ],
)
def test_report_writes_png_and_csv_with_its_columns(
    report: Report, name: str, tmp_path: Path
) -> None:
    art = report(tmp_path, quick=True, runner=fake_run)
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    with (tmp_path / f"{name}.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows
    assert list(rows[0]) == list(art.columns)
    assert json.loads((tmp_path / f"{name}.json").read_text())["artefact"] == name


def test_fig16_uses_the_16_region_topology(tmp_path: Path) -> None:
    art = run_fig12(tmp_path, quick=True, scale="fig16", runner=fake_run)
    assert art.meta["topology"] == "sim-16region"
    assert (tmp_path / "fig16.png").stat().st_size > 1000


def test_peak_is_the_hottest_workers_compute_over_the_pool_mean(tmp_path: Path) -> None:
    # w0-w2 compute 100 ms each, w3 300 ms (200 prefill + 100 reload), w4 nothing:
    # mean 600 / 5 = 120, peak 300 / 120 = 2.5. The window samples say otherwise (w0
    # spikes to 9 in one window): the peak is not their mean.
    records = [
        SimRecord(
            f"r{i}",
            "s",
            "t",
            "a",
            "random",
            w,
            "a",
            0.1 * i,
            100,
            10,
            0,
            0,
            0,
            0.0,
            1.0,
            0.0,
            prefill,
            reload,
            1.0,
            2.0,
            "random",
        )
        for i, (w, prefill, reload) in enumerate(
            [("w0", 100.0, 0.0), ("w1", 100.0, 0.0), ("w2", 100.0, 0.0), ("w3", 200.0, 100.0)]
        )
    ]
    samples = [LoadSample(0.0, "w0", 0.0, 1, 9.0), LoadSample(1.0, "w0", 0.0, 1, 9.0)]
    result = SimResult(records, samples, {"policy": "random"}, 0.1, {"n_workers": 5})
    result.write(tmp_path)
    run = load_run(tmp_path)
    peak, hottest = peak_load_factor(run)
    assert hottest == "w3"
    assert peak == pytest.approx(2.5)
    assert run.summary["peak_load_factor"] == pytest.approx(2.5)  # the simulator's own


def test_a_peak_splits_into_its_regions_excess_and_the_hottest_workers_within_it() -> None:
    # Region a: a0 300 ms, a1 100 ms, a2 idle; region b: b0 200 ms. Pool mean 600 / 4 =
    # 150, peak a0 = 2.0. Region a's mean counts idle a2: 400 / 3, so a0 is 2.25 times
    # it and region a 0.889 times the pool. The arrivals span 1 s of four workers: 0.15.
    served = [("a0", "a", 300.0), ("a1", "a", 100.0), ("b0", "b", 200.0), ("a0", "a", 0.0)]
    run = Run(
        summary={"n_workers": 4},
        config={},
        requests={
            "worker": np.array([w for w, _, _ in served], dtype=object),
            "worker_region": np.array([r for _, r, _ in served], dtype=object),
            "prefill_ms": np.array([ms for _, _, ms in served]),
            "reload_ms": np.zeros(len(served)),
            "arrival_s": np.array([0.0, 0.2, 0.5, 1.0]),
        },
        load={},
    )
    split = peak_split(run, {"a": 3, "b": 1})
    assert split.region == "a"
    assert split.in_region == pytest.approx(2.25)
    assert split.across_regions == pytest.approx(2.0 / 2.25)
    assert split.across_regions * split.in_region == pytest.approx(peak_load_factor(run)[0])
    assert split.pool_busy == pytest.approx(0.15)


def test_fig12_has_a_row_of_panels_per_workload_at_each_workloads_own_rates(
    tmp_path: Path,
) -> None:
    art = run_fig12(tmp_path, quick=True, runner=fake_run)
    by_workload: dict[str, set[float]] = {}
    for row in art.rows:
        by_workload.setdefault(str(row["workload"]), set()).add(float(row["rate"]))
    assert set(by_workload) == {"mixed", "wildchat", "lmsys"}
    # Rates are multiples of each workload's own λ0: chats' shorter prompts run faster.
    assert min(by_workload["wildchat"]) > min(by_workload["mixed"])
    assert set(art.meta["p99_ttft_over_kvcompass"]) == {"mixed", "wildchat", "lmsys"}
    assert all(art.meta["p99_ttft_over_kvcompass"].values())
    folders = {p.name.split("__")[0] for p in (tmp_path / "grid").iterdir() if p.is_dir()}
    assert folders == {"mixed", "wildchat", "lmsys"}


def test_peak_report_averages_seeds_per_rate_and_flags_the_2_percent_target() -> None:
    def run(peak: float) -> Run:
        summary = {"peak_load_factor": peak, "ttft_p99_ms": 1.0, "throughput_req_per_s": 1.0}
        return Run(summary, {}, {}, {})

    ours = {(100.0, 0): 1.05, (100.0, 1): 1.07, (200.0, 0): 1.02, (200.0, 1): 1.03}
    oracle = {(100.0, 0): 1.00, (100.0, 1): 1.00, (200.0, 0): 1.01, (200.0, 1): 1.01}
    runs = {Cell("kvcompass", r, s): run(p) for (r, s), p in ours.items()}
    runs |= {Cell("oracle", r, s): run(p) for (r, s), p in oracle.items()}
    rows = {row["rate"]: row for row in tabulate(runs)}
    assert rows[100.0]["kvcompass_peak"] == pytest.approx(1.06)
    assert rows[100.0]["gap_pct"] == pytest.approx(6.0)
    assert rows[100.0]["seeds"] == 2
    assert not rows[100.0]["within_target"]
    assert rows[200.0]["gap_pct"] == pytest.approx(100 * (1.025 / 1.01 - 1))
    assert rows[200.0]["within_target"]


def _busy_run(peak: float, busy: float) -> Run:
    """A run whose pool (sim-8region's 64 workers) was ``busy`` over a 1-s window."""
    compute = busy * 64 * 1000.0
    summary = {"peak_load_factor": peak, "ttft_p99_ms": 1.0, "throughput_req_per_s": 1.0}
    requests = {
        "worker": np.array(["us-0", "us-0"], dtype=object),
        "worker_region": np.array(["us", "us"], dtype=object),
        "prefill_ms": np.array([compute / 2, compute / 2]),
        "reload_ms": np.zeros(2),
        "arrival_s": np.array([0.0, 1.0]),
    }
    return Run(summary | {"n_workers": 64}, {}, requests, {})


def test_peak_report_compares_kvcompass_with_the_oracle_at_the_same_pool_busy_share() -> None:
    # The Oracle alone at rate 50 (busy 0.4, peak 1.3) and with KVCompass at 100 (0.8,
    # 1.05); KVCompass at 100 is 0.5 busy: the Oracle's peak there is 1.3 + 0.25 * -0.25.
    runs = {
        Cell("oracle", 50.0): _busy_run(1.3, 0.4),
        Cell("oracle", 100.0): _busy_run(1.05, 0.8),
        Cell("kvcompass", 100.0): _busy_run(1.2, 0.5),
        Cell("oracle", 200.0): _busy_run(1.01, 1.2),
        Cell("kvcompass", 200.0): _busy_run(1.02, 1.5),  # busier than any Oracle point
    }
    rows = {row["rate"]: row for row in tabulate(runs)}
    assert sorted(rows) == [100.0, 200.0]  # the Oracle-only rate is a point, not a row
    assert rows[100.0]["oracle_peak_same_busy"] == pytest.approx(1.2375)
    assert rows[100.0]["gap_same_busy_pct"] == pytest.approx(100 * (1.2 / 1.2375 - 1))
    assert rows[100.0]["gap_pct"] == pytest.approx(100 * (1.2 / 1.05 - 1))  # same rate
    assert math.isnan(rows[200.0]["oracle_peak_same_busy"])
    assert [round(b, 6) for _, b, _ in oracle_curve(runs)] == [0.4, 0.8, 1.2]
