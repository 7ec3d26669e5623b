"""The grid runner (``sim sweep`` and the reports) resumes: cells with a complete
summary.json are not run again; every distinct cell has its own folder."""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvcompass.loadgen.cli import main as loadgen_main
from kvcompass.loadgen.reports.cells import paper_cell
from kvcompass.loadgen.sim import SimConfig, simulate
from kvcompass.loadgen.sim import cli as sim_cli
from kvcompass.loadgen.sim.cell import (
    MAX_KEY_CHARS,
    Cell,
    recorded_config,
    run_cell,
    topology_of,
)
from kvcompass.loadgen.sim.fingerprint import code_fingerprint, fingerprint_of
from kvcompass.loadgen.sim.grid import done_summary, run_grid
from kvcompass.loadgen.sim.testing import shared_prefixes
from kvcompass.loadgen.testing import poll_until
from kvcompass.routing.testing import TOY


class _Counting:
    """Writes what a finished run of the cell records, without simulating it."""

    def __init__(self) -> None:
        self.ran: list[Cell] = []

    def __call__(self, cell: Cell, folder: Path) -> None:
        self.ran.append(cell)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "requests.csv").write_text("request_id\nr0\n")
        (folder / "load.csv").write_text("t_s,worker,queue_ms,running,load_factor\r\n")
        record = {"summary": ONE, "config": recorded_config(cell), "code": code_fingerprint()}
        (folder / "summary.json").write_text(json.dumps(record))


CELLS = [Cell(p, r) for p in ("kvcompass", "random") for r in (100.0, 200.0)]
#: The summary of a one-request run, which the counting runner writes.
ONE = {"requests": 1}


def test_second_run_skips_every_complete_cell(tmp_path: Path) -> None:
    runner = _Counting()
    folders = run_grid(CELLS, tmp_path, runner=runner, progress=False)
    assert sorted(runner.ran, key=str) == sorted(CELLS, key=str)
    assert len(set(folders.values())) == len(CELLS)
    again = _Counting()
    run_grid(CELLS, tmp_path, runner=again, progress=False)
    assert again.ran == []


def test_incomplete_or_missing_summary_reruns_only_that_cell(tmp_path: Path) -> None:
    run_grid(CELLS, tmp_path, runner=_Counting(), progress=False)
    (tmp_path / CELLS[0].key / "summary.json").write_text('{"summ')  # cut mid-write
    (tmp_path / CELLS[1].key / "summary.json").unlink()
    again = _Counting()
    run_grid(CELLS, tmp_path, runner=again, progress=False)
    assert sorted(again.ran, key=str) == sorted(CELLS[:2], key=str)


def test_a_cell_whose_requests_were_cut_short_runs_again_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished cell whose requests.csv lost rows (a partial copy of the results) would
    feed the reports a fraction of its run: it is not done, and a grid runs it again."""
    run_grid(CELLS, tmp_path, runner=_Counting(), progress=False)
    cut, gone = tmp_path / CELLS[0].key, tmp_path / CELLS[3].key
    (cut / "requests.csv").write_text("request_id\n")
    (gone / "requests.csv").unlink()
    assert done_summary(cut) is None
    assert done_summary(gone, CELLS[3]) is None
    assert done_summary(tmp_path / CELLS[1].key, CELLS[1]) == ONE
    again = _Counting()
    run_grid(CELLS, tmp_path, runner=again, progress=False)
    assert sorted(again.ran, key=str) == sorted([CELLS[0], CELLS[3]], key=str)
    err = capsys.readouterr().err
    assert f"running 2 finished cell(s) under {tmp_path} again: their records are damaged" in err
    assert "requests.csv holds 0 of 1 rows" in err
    assert done_summary(cut, CELLS[0]) == ONE


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no load.csv"),
        ("", "no load.csv, or an empty one"),
        ("a,b\r\n", "load.csv starts b'a,b', not its header"),
        ("t_s,worker,queue_ms,running,load_factor\r\n1.0,us-0,0.0,1,0.", "ends mid-line"),
    ],
)
def test_a_cell_whose_load_samples_are_damaged_runs_again_and_says_why(
    text: str | None, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """load.csv feeds Fig. 14's heatmap; a partial copy cut it, or replaced it, and the
    report raised a KeyError. Its row count is not recorded: the header and the last
    line's end are checked instead."""
    run_grid(CELLS[:1], tmp_path, runner=_Counting(), progress=False)
    load = tmp_path / CELLS[0].key / "load.csv"
    if text is None:
        load.unlink()
    else:
        load.write_text(text)
    assert done_summary(load.parent, CELLS[0]) is None
    again = _Counting()
    run_grid(CELLS[:1], tmp_path, runner=again, progress=False)
    assert again.ran == CELLS[:1]
    assert why in capsys.readouterr().err
    assert done_summary(load.parent, CELLS[0]) == ONE


def test_a_folder_made_under_other_defaults_runs_again_and_says_which_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A default that changed between two runs of one grid (same folder name, other
    behaviour) must not be resumed as if current: the cell runs again, and until its
    rerun finishes the folder does not count as done."""
    run_grid(CELLS, tmp_path, runner=_Counting(), progress=False)
    old = tmp_path / CELLS[2].key / "summary.json"
    record = json.loads(old.read_text())
    record["config"]["routing"]["remote_margin_rtt"] = 0.25  # what an older default gave
    old.write_text(json.dumps(record))
    assert done_summary(old.parent) == ONE
    assert done_summary(old.parent, CELLS[2]) is None

    def fails(cell: Cell, folder: Path) -> None:
        raise RuntimeError("killed mid-run")

    with pytest.raises(RuntimeError):
        run_grid(CELLS, tmp_path, runner=fails, progress=False)
    assert "routing.remote_margin_rtt: 0.25 → 1.0" in capsys.readouterr().err
    assert not old.exists()
    again = _Counting()
    run_grid(CELLS, tmp_path, runner=again, progress=False)
    assert again.ran == [CELLS[2]]
    assert done_summary(old.parent, CELLS[2]) == ONE


def test_a_cell_other_code_made_is_kept_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Code no setting records (the routing core, the simulator) changed between two runs
    of one grid: the cell is not run again, but the run says it came from other code."""
    run_grid(CELLS, tmp_path, runner=_Counting(), progress=False)
    again = _Counting()
    run_grid(CELLS, tmp_path, runner=again, progress=False)
    assert again.ran == []
    assert "other code" not in capsys.readouterr().err
    old = tmp_path / CELLS[1].key / "summary.json"
    record = json.loads(old.read_text())
    record["code"] = "0123456789abcdef"
    old.write_text(json.dumps(record))
    run_grid(CELLS, tmp_path, runner=again, progress=False)
    assert again.ran == []
    err = capsys.readouterr().err
    assert f"keeping 1 finished cell(s) under {tmp_path} that other code made" in err
    assert f"{CELLS[1].key} (0123456789abcdef → {code_fingerprint()})" in err


def test_a_simulation_records_the_fingerprint_of_its_code(tmp_path: Path) -> None:
    result = simulate(SimConfig(TOY, seed=1), shared_prefixes(TOY, 20.0, 20, seed=1))
    record = json.loads((result.write(tmp_path) / "summary.json").read_text())
    assert record["code"] == code_fingerprint()


def test_the_fingerprint_covers_sources_only(tmp_path: Path) -> None:
    """Any source byte or name changes it; caches and other files do not."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "t.toml").write_text("[index]\n")
    roots = [tmp_path / "pkg"]
    first = fingerprint_of(roots)
    assert len(first) == 16
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "notes.md").write_text("notes")
    assert fingerprint_of(roots) == first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert fingerprint_of(roots) != first
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    assert fingerprint_of(roots) == first
    (tmp_path / "pkg" / "sub" / "t.toml").rename(tmp_path / "pkg" / "sub" / "u.toml")
    assert fingerprint_of(roots) != first


def test_cell_keys_differ_by_every_knob() -> None:
    cells = [
        Cell("kvcompass", 100),
        Cell("kvcompass", 100, seed=1),
        Cell("kvcompass", 100, ablations=("tier_aware",)),
        Cell("kvcompass", 100, ablations=("tier_aware", "migration")),
        Cell("kvcompass", 100, workload="mixed"),
        Cell("kvcompass", 100, duration=None, requests=300),
        Cell("kvcompass", 100, resync=False),
        Cell("kvcompass", 100, serving_overhead_ms=15.0),
        paper_cell("kvcompass", 100),
        Cell("kvcompass", 100, update_loss=0.3),
        Cell("kvcompass", 100, update_loss=0.3, resync=False),
        Cell("kvcompass", 100, jitter_pct=50),
    ]
    assert len({c.key for c in cells}) == len(cells)


def test_a_cell_with_many_knobs_still_names_a_folder_the_file_system_takes(
    tmp_path: Path,
) -> None:
    # Eight region weights with full float digits made a 330-character name: a sweep
    # died on "File name too long".
    weights = (0.6, *(0.4 * w / 34 for w in (13, 8, 3, 3, 3, 2, 2)))
    cell = paper_cell("kvcompass", 237.1, requests=20000, region_weights=weights)
    other = paper_cell("kvcompass", 237.1, requests=20000, region_weights=(*weights[:-1], 0.02))
    assert cell.key != other.key
    assert cell.key.startswith("mixed__kvcompass__r237.1__")
    for c in (cell, other):
        assert len(c.key) <= MAX_KEY_CHARS
        (tmp_path / c.key).mkdir()  # OSError if the name were too long
    assert Cell("kvcompass", 100).key == "synthetic__kvcompass__r100"  # short keys unchanged


def test_report_cells_keep_the_papers_edges_but_table4_compares_both() -> None:
    from kvcompass.loadgen.reports import fig9, fig12, fig15, table4

    paper = [
        *fig9.cells(quick=True),
        *fig12.cells(fig12.SCALES["fig12"], quick=True),
        *fig15.cells(quick=True),
    ]
    assert all(not c.resync and c.workload == "mixed" and c.duration is None for c in paper)
    rows = table4.cells(quick=True)
    lossy = [c for c in rows if c.update_loss]
    assert {(c.resync, c.prefix_chain) for c in lossy} == {
        (False, False),
        (True, False),
        (False, True),
        (True, True),
    }
    assert not any(c.resync for c in rows if not c.update_loss)
    chained = [table4.variant(c) for c in rows if c.prefix_chain and not c.update_loss]
    assert chained == ["base"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "0"], "kvcompass sim: duration must be positive (or unbounded), got 0.0"),
        (["--requests", "0"], "kvcompass sim: requests must be at least 1 (or unbounded), got 0"),
        (["--rate", "-5"], "kvcompass sim: rate must be positive, got -5.0"),
        (["--workload", "mixed", "--rate", "0"], "kvcompass sim: rate must be positive, got 0.0"),
    ],
)
def test_a_run_without_arrivals_stops_with_one_line_naming_the_setting(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sim_cli.main(["run", *args, "--out", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("flag", "name"),
    [
        ("--rate", "rate"),  # every arrival at t = 0
        ("--serving-overhead-ms", "serving_overhead_ms"),  # hung the event loop
        ("--remote-margin-rtt", "remote_margin_rtt"),  # NaN scores for local workers
        ("--flush-ms", "flush_ms"),  # the index never written
    ],
)
def test_an_infinite_setting_stops_the_run_with_one_line(
    flag: str, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--requests", "5", flag, "inf", "--out", str(tmp_path / "run")]
    assert sim_cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"kvcompass sim: {name} must be finite, got inf"


def test_a_sweep_with_a_bad_rate_runs_no_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sweep", "--rates", "10,-1", "--duration", "1", "--policies", "random"]
    assert sim_cli.main([*args, "--jobs", "1", "--out", str(tmp_path / "sweep")]) == 2
    assert capsys.readouterr().err.strip() == "kvcompass sim: rate must be positive, got -1.0"
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_a_sweep_with_fewer_than_one_job_runs_no_cell(
    jobs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sweep", "--rates", "10", "--duration", "1", "--policies", "random"]
    assert sim_cli.main([*args, "--jobs", jobs, "--out", str(tmp_path / "sweep")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kvcompass sim: --jobs must be at least 1 (or left out: CPU count), got {jobs}"
    )
    assert not (tmp_path / "sweep").exists()


def test_a_cell_hands_its_remote_margin_to_kvcompass_and_names_it_in_its_key() -> None:
    cell = Cell("kvcompass", 100, remote_margin_rtt=1.5)
    topology = topology_of(cell.topology)
    assert cell.sim_config(topology).routing.remote_margin_rtt == 1.5
    shipped = Cell("kvcompass", 100)
    assert shipped.sim_config(topology).routing.remote_margin_rtt == 1.0  # as the router ships
    assert "remote_margin" not in shipped.key
    assert "remote_margin_rtt=1.5" in cell.key
    paper = paper_cell("kvcompass", 100)
    assert paper.sim_config(topology).routing.remote_margin_rtt == 0.0  # the paper's score
    assert "remote_margin_rtt=0.0" in paper.key


@pytest.mark.parametrize("knob", ["pending_credit", "prefix_chain"])
def test_a_cell_hands_its_switch_to_kvcompass_and_the_paper_cells_turn_it_off(knob: str) -> None:
    """Both beyond-the-paper switches are on as shipped, off in the paper's cells."""
    topology = topology_of("sim-8region")
    assert getattr(Cell("kvcompass", 100).sim_config(topology).routing, knob)  # as shipped
    switched_off: dict[str, Any] = {knob: False}
    off = Cell("kvcompass", 100, **switched_off)
    assert not getattr(off.sim_config(topology).routing, knob)
    assert f"{knob}=False" in off.key
    paper = paper_cell("kvcompass", 100)
    assert not getattr(paper.sim_config(topology).routing, knob)  # the paper's KVCompass
    assert f"{knob}=False" in paper.key


def test_a_cell_hands_its_capacity_price_to_kvcompass_and_the_paper_cells_pin_the_papers() -> None:
    topology = topology_of("sim-8region")
    shipped = Cell("kvcompass", 100).sim_config(topology).routing
    assert (shipped.tau_ms, shipped.lambda_max) == (10.0, 80.0)  # as the router ships
    paper = paper_cell("kvcompass", 100)
    routing = paper.sim_config(topology).routing
    assert (routing.tau_ms, routing.lambda_max) == (350.0, 8.0)
    assert "tau_ms=350.0" in paper.key
    assert "lambda_max=8.0" in paper.key
    other = Cell("kvcompass", 100, tau_ms=35.0)
    assert other.sim_config(topology).routing.tau_ms == 35.0
    assert "tau_ms=35.0" in other.key


@pytest.mark.parametrize(("tau_ms", "lambda_max"), [(0.0, 8.0), (-1.0, 8.0), (10.0, -0.5)])
def test_a_cell_refuses_a_capacity_price_without_meaning(tau_ms: float, lambda_max: float) -> None:
    with pytest.raises(ValueError, match="capacity price"):
        Cell("kvcompass", 100, tau_ms=tau_ms, lambda_max=lambda_max)


def test_a_trace_cell_replays_the_traces_own_times_when_asked(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    stamps_ms = [5_000, 6_000, 9_000, 13_000]
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": [i]})
            + "\n"
            for i, t in enumerate(stamps_ms)
        )
    )
    base = Cell(topology="testbed-3region", workload="trace", trace=trace, duration=None)
    timed = replace(base, trace_times=True, speed=2.0)
    topology = topology_of(base.topology)
    arrivals = [r.at_s for r in timed.requests_of(topology)]
    assert arrivals == [0.0, 0.5, 2.0, 4.0]  # from the first, halved
    poisson = [r.at_s for r in base.requests_of(topology)]
    assert poisson != arrivals
    assert "__trace-times" in timed.key
    assert "__r" not in timed.key
    with pytest.raises(ValueError, match="trace_times replays a trace's arrivals, not mixed's"):
        Cell(workload="mixed", trace_times=True)


def test_a_negative_seed_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^seed must be >= 0, got -1$"):
        Cell(seed=-1)


def test_sim_run_replays_a_trace_at_its_own_times_unless_given_a_rate() -> None:
    def cell(*extra: str) -> Cell:
        args = sim_cli.parser().parse_args(["run", "--workload", "trace", *extra])
        return sim_cli._cell(args)

    assert cell().trace_times
    assert not cell("--rate", "40").trace_times
    assert cell("--rate", "40").rate == 40.0
    mixed = sim_cli._cell(sim_cli.parser().parse_args(["run", "--workload", "mixed"]))
    assert (mixed.trace_times, mixed.rate) == (False, 100.0)


def test_a_second_grid_on_one_folder_waits_for_the_first_then_finds_its_cells_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two reports sharing an --out (fig12 and fig13 need the same cells) must not write
    the same cell folders at once."""
    first = _Counting()
    with open(tmp_path / ".grid.lock", "a+") as held:  # what a running grid holds
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 4242")
        held.flush()
        second = _Counting()
        waiting = threading.Thread(
            target=run_grid, args=(CELLS, tmp_path), kwargs={"runner": second}
        )
        waiting.start()
        poll_until(
            lambda: "waiting for pid 4242, which runs a grid under" in capsys.readouterr().err,
            10,
            "the second grid says whom it waits for",
        )
        assert second.ran == []  # nothing run, nothing written while the first holds it
        run_grid(CELLS[:2], tmp_path / "elsewhere", runner=first)  # other folders: no wait
        assert len(first.ran) == 2
        fcntl.flock(held, fcntl.LOCK_UN)
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    assert sorted(second.ran, key=str) == sorted(CELLS, key=str)
    again = _Counting()
    run_grid(CELLS, tmp_path, runner=again)
    assert again.ran == []  # the lock is free again, and every cell done


def test_sim_run_takes_the_load_generators_trace_options() -> None:
    argv = ["run", "--workload", "trace", "--skip", "100", "--tenants", "a,b", "--speed", "3"]
    cell = sim_cli._cell(sim_cli.parser().parse_args(argv))
    assert (cell.skip, cell.tenants, cell.speed) == (100, "a,b", 3.0)


@pytest.mark.parametrize(
    ("option", "reader"),
    [
        (["--trace", "t.jsonl"], "--workload trace"),
        (["--skip", "5"], "--workload trace"),
        (["--tenants", "a,b"], "--workload trace"),
        (["--speed", "2"], "--workload trace and --azure"),
    ],
)
def test_a_trace_option_given_to_another_workload_stops_the_run_with_one_line(
    option: list[str], reader: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to be ignored: `sim sweep --trace T` drew the synthetic workload into a
    # folder named after T, and `sim run` printed that workload's summary.
    args = ["--workload", "mixed", "--requests", "20", *option]
    line = f"{option[0]} is read only by {reader}, not by --workload mixed"
    assert sim_cli.main(["run", *args]) == 2
    assert capsys.readouterr().err.strip() == f"kvcompass sim: {line}"
    sweep = ["sweep", *args, "--jobs", "1", "--out", str(tmp_path / "sweep")]
    assert sim_cli.main(sweep) == 2
    assert capsys.readouterr().err.strip().endswith(f"kvcompass sim: {line}")
    assert not list((tmp_path / "sweep").glob("*/summary.json"))


def _one_record_trace(folder: Path) -> Path:
    """A Mooncake trace of one 600-token request at t = 0."""
    trace = folder / "trace.jsonl"
    record = {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}
    trace.write_text(json.dumps(record) + "\n")
    return trace


def test_a_trace_replayed_at_a_poisson_rate_refuses_a_speed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --speed scaled nothing once --rate replaced the trace's times, and said nothing.
    trace = _one_record_trace(tmp_path)
    run = ["run", "--workload", "trace", "--trace", str(trace), "--topology", "testbed-3region"]
    assert sim_cli.main([*run, "--rate", "5", "--speed", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kvcompass sim: --speed scales the trace's own arrival times, which a Poisson rate "
        "(--rate, --set rate=) replaces: give one of them"
    )
    assert sim_cli.main([*run, "--speed", "2"]) == 0
    assert sim_cli.main([*run, "--rate", "5"]) == 0


@pytest.mark.parametrize(
    ("option", "line"),
    [
        ('eviction = "lfru"', "unknown eviction 'lfru'; known: lru, lfu, fifo"),
        ('workload = "mix"', "unknown workload 'mix'; known: mixed, wildchat, lmsys, synthetic, "),
        ('ablations = ["tiers"]', "unknown ablation(s) ['tiers']; known: ['load_aware', "),
    ],
)
def test_a_grid_naming_an_unknown_choice_runs_no_cell(
    option: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The eviction read "'lfru' is not a valid EvictionPolicy", and all three stopped the
    # sweep only once its first cell ran.
    grid = tmp_path / "grid.toml"
    grid.write_text(f'policies = ["random"]\nrates = [5.0]\n{option}\n')
    out = tmp_path / "out"
    assert sim_cli.main(["sweep", "--grid", str(grid), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"kvcompass sim: {line}")
    assert not out.exists()


def test_an_endless_workload_without_a_finite_bound_is_refused_before_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `sim run --duration inf` simulated until killed; `loadgen --dry-run --duration inf`
    # listed requests until memory ran out.
    line = (
        "the synthetic workload is endless and --duration inf bounds nothing: give a finite "
        "--duration or --requests"
    )
    with pytest.raises(ValueError, match="endless"):
        Cell(duration=None)
    assert sim_cli.main(["run", "--duration", "inf", "--topology", "testbed-3region"]) == 2
    assert capsys.readouterr().err.strip() == f"kvcompass sim: {line}"
    assert loadgen_main(["--dry-run", "--duration", "inf"]) == 2
    assert capsys.readouterr().err.strip() == f"kvcompass loadgen: {line}"
    assert Cell(duration=math.inf, requests=5).requests == 5  # a count bounds it


def test_a_cell_in_which_no_request_arrives_is_an_error_not_a_row_of_zeros(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A window shorter than the first arrival, and a trace skipped past its end: both
    # used to print TTFT 0.0 ms and exit 0, and a sweep wrote such a cell as done.
    trace = _one_record_trace(tmp_path)
    skipped = Cell(topology="testbed-3region", workload="trace", trace=trace, skip=5)
    with pytest.raises(ValueError, match=r"^no request arrived in the trace .*skipping 5 rec"):
        run_cell(skipped)
    run = ["run", "--duration", "0.001", "--rate", "1", "--out", str(tmp_path / "run")]
    assert sim_cli.main(run) == 2
    assert capsys.readouterr().err.strip() == (
        "kvcompass sim: no request arrived in the synthetic workload (at 1 req/s, for "
        "0.001 s), so there is nothing to report"
    )
    assert not list((tmp_path / "run").glob("*"))  # checked (made) before the run; empty
    sweep = ["sweep", "--duration", "0.001", "--rates", "1", "--policies", "random"]
    assert sim_cli.main([*sweep, "--jobs", "1", "--out", str(tmp_path / "sweep")]) == 2
    assert not list((tmp_path / "sweep").glob("*/summary.json"))  # no cell counts as done


@pytest.mark.parametrize(
    ("flags", "name"),
    [(["--policies", ""], "policies"), (["--seeds", " , "], "seeds"), (["--rates", ","], "rates")],
)
def test_an_empty_sweep_grid_is_refused_not_written_as_done(
    flags: list[str], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to write an empty index.csv and exit 0, as if every cell had run.
    argv = ["sweep", "--duration", "1", "--rates", "10", "--policies", "random", *flags]
    assert sim_cli.main([*argv, "--jobs", "1", "--out", str(tmp_path / "sweep")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kvcompass sim: the grid has no {name} (--{name} names none): nothing to run"
    )
    assert not (tmp_path / "sweep").exists()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


#: What the freeing runner keeps alive until the test ends: every 64th of its chunks, so
#: the heap cannot give the freed ones back by shrinking from its top.
_PINNED: list[bytes] = []


class _Freeing(_Counting):
    """Allocates 256 MiB in 4 KiB chunks, keeps 1/64 of them and frees the rest."""

    def __call__(self, cell: Cell, folder: Path) -> None:
        chunks = [bytes(4096) for _ in range(65_536)]
        _PINNED.extend(chunks[::64])
        del chunks
        super().__call__(cell, folder)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim"
)
def test_a_finished_cell_gives_back_the_memory_it_freed(tmp_path: Path) -> None:
    """A process runs cell after cell; what a cell freed must go back to the OS, or the
    process grows to several cells' peaks (the peak report's pool processes reached
    5 GB for cells of ~1.3 GB each)."""
    before = _resident_bytes()
    try:
        run_grid(CELLS[:1], tmp_path, runner=_Freeing(), progress=False)
        grown = _resident_bytes() - before
    finally:
        _PINNED.clear()
    assert grown < 64 << 20, f"{grown >> 20} MiB of the 256 MiB freed stayed resident"
