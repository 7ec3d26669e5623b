"""``kvcompass sim sweep``: one folder per cell, an index, and resuming skips done cells."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcompass.loadgen.sim import cli as sim_cli
from kvcompass.loadgen.sim.cell import Cell, topology_of
from kvcompass.loadgen.sim.grid import product, run_grid
from kvcompass.loadgen.testing import poll_until
from kvcompass.services.maintenance.settings import MaintenanceSettings

BASE = Cell(topology="testbed-3region", rate=4.0, duration=1.5, params=("answer_tokens_max=16",))


def test_sweep_writes_every_cell_then_resumes_without_rerunning(tmp_path: Path) -> None:
    grid = product(BASE, ["kvcompass", "round-robin"], [4.0], [0, 1])
    seen: list[bool] = []
    folders = run_grid(grid, tmp_path, jobs=2, on_done=lambda _c, skipped: seen.append(skipped))

    assert seen == [False] * 4
    with open(tmp_path / "index.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["policy"], r["seed"]) for r in rows} == {
        (p, s) for p in ("kvcompass", "round-robin") for s in ("0", "1")
    }
    assert all(int(r["requests"]) > 0 for r in rows)
    assert {r["folder"] for r in rows} == {f.name for f in folders.values()}
    stamps = {c: (folders[c] / "summary.json").stat().st_mtime_ns for c in grid}

    # A cell whose summary is missing (an interrupted run) is the only one run again.
    (folders[grid[0]] / "summary.json").unlink()
    seen.clear()
    run_grid(grid, tmp_path, jobs=1, on_done=lambda _c, skipped: seen.append(skipped))
    assert sorted(seen) == [False, True, True, True]
    for cell in grid[1:]:
        assert (folders[cell] / "summary.json").stat().st_mtime_ns == stamps[cell]
    assert (folders[grid[0]] / "summary.json").exists()


def test_a_cell_sets_the_flush_period_and_defaults_to_the_live_one() -> None:
    topology = topology_of(BASE.topology)
    assert BASE.sim_config(topology).flush_ms == MaintenanceSettings().flush_ms
    longer = Cell(topology=BASE.topology, flush_ms=20.0)
    assert longer.sim_config(topology).flush_ms == 20.0


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (zombies excluded)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize(
    ("whole_group", "signum"),
    [(True, signal.SIGINT), (False, signal.SIGINT), (False, signal.SIGTERM)],
    ids=["ctrl-c", "kill-int", "kill-term"],
)
def test_a_stop_signal_ends_a_parallel_sweep_at_once_and_the_same_command_resumes(
    tmp_path: Path, whole_group: bool, signum: signal.Signals
) -> None:
    """Ctrl-C in a terminal signals the whole process group, workers included;
    ``kill`` (or ``timeout``, a container's stop) the command alone. Each stops it now:
    a pool that waited for its queued cells ran all nine before exiting, and after a
    SIGTERM the workers finished their cells on their own."""
    out = tmp_path / "grid"
    # A shell starts background jobs with SIGINT ignored, and Python then keeps it so:
    # the command runs here as a terminal would start it, Ctrl-C raising.
    cli = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from kvcompass.services.cli import main; raise SystemExit(main())"
    )
    argv = [sys.executable, "-c", cli, "sim", "sweep"]
    argv += ["--topology", "testbed-3region", "--workload", "mixed", "--requests", "1500"]
    argv += ["--policies", "kvcompass,round-robin,random", "--rates", "20,30,40"]
    argv += ["--jobs", "2", "--out", str(out)]
    # Its own process group, which a terminal's Ctrl-C signals whole: workers included.
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        poll_until(lambda: list(out.glob("*/summary.json")), 120, "a first finished cell")
        if whole_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        stopped = time.monotonic()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.monotonic() - stopped < 10, "the sweep waited for its queued cells"
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == (
        f"kvcompass sim: interrupted; the cells finished so far are kept under {out}: "
        "the same command runs the rest"
    )
    assert "Traceback" not in err
    poll_until(lambda: not _processes_naming(str(out)), 10, "no worker left running")
    finished = {p.parent.name for p in out.glob("*/summary.json")}
    assert 0 < len(finished) < 9
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    assert again.returncode == 0
    assert len(list(out.glob("*/summary.json"))) == 9


def test_ctrl_c_in_a_single_run_stops_with_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim_cli, "run_cell", interrupted)
    out = tmp_path / "run"
    try:
        code = sim_cli.main(["run", "--requests", "5", "--out", str(out), "--no-progress"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped kvcompass sim run with a traceback")
    assert code == 130
    assert capsys.readouterr().err.splitlines() == ["kvcompass sim: interrupted; nothing written"]
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("requestz = 10", "unknown option 'requestz'; known: ablations, azure, "),
        ('requests = "ten"', "requests must be int | None, got 'ten'"),
        ("resync = 1", "resync must be bool, got 1"),
        ("duration = true", "duration must be float | None, got True"),
        ('region_weights = ["a"]', "region_weights must be tuple[float, ...], got ['a']"),
        ("rate = 5.0", "unknown option 'rate'"),
        ('policies = "random"', "policies must be a list, e.g. policies = [...], got 'random'"),
        ("rates = [true]", "rates must be a list"),
        ('rates = [5, "fast"]', "rates must be a list of numbers, got 'fast' in [5, 'fast']"),
        ("seeds = [0, 1.5]", "seeds must be a list of whole numbers, got 1.5 in [0, 1.5]"),
        ("policies = [1]", "policies must be a list of names, got 1 in [1]"),
        ("requests = [", "Invalid value"),
    ],
)
def test_a_grid_file_with_a_wrong_key_or_type_stops_with_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str
) -> None:
    grid = tmp_path / "grid.toml"
    base = {"policies": 'policies = ["random"]', "rates": "rates = [5.0]"}
    given = text.split(" = ")[0]
    grid.write_text("\n".join([*(v for k, v in base.items() if k != given), text]) + "\n")
    out = tmp_path / "out"
    assert sim_cli.main(["sweep", "--grid", str(grid), "--out", str(out)]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith(f"kvcompass sim: {grid}: {why}"), err
    assert not out.exists()


def test_a_grid_file_may_write_floats_as_integers_and_tuples_as_lists(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'policies = ["random"]\nrates = [5]\nseeds = [0, 1]\nduration = 2\nrequests = 10\n'
        'topology = "testbed-3region"\nparams = ["answer_tokens_max=16"]\n'
        "region_weights = [1, 1, 2]\nresync = false\n"
    )
    out = tmp_path / "out"
    assert sim_cli.main(["sweep", "--grid", str(grid), "--out", str(out), "--jobs", "1"]) == 0
    assert len(list(out.glob("*/summary.json"))) == 2
