"""bench/sim_ab.py: the paired comparison of two simulators says what it measured."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench"))  # appended: its module names must not shadow others
sim_ab: Any = importlib.import_module("sim_ab")


def _run(cpu_s: float, records: str) -> dict[str, Any]:
    return {"cpu_s": cpu_s, "records": records}


def test_the_ratio_is_the_median_of_the_pairs_old_over_new() -> None:
    old = [_run(2.0, "a"), _run(3.0, "a"), _run(1.2, "a")]
    new = [_run(1.0, "a"), _run(2.0, "a"), _run(1.2, "a")]
    out = sim_ab.summary(old, new)
    assert out["ratio"] == 1.5  # pairs 2.0, 1.5, 1.0
    assert out["old_cpu_s"] == [2.0, 3.0, 1.2]
    assert out["identical"] is True


def test_records_that_differ_in_any_run_are_not_identical() -> None:
    old = [_run(1.0, "a"), _run(1.0, "a")]
    assert sim_ab.summary(old, [_run(1.0, "a"), _run(1.0, "b")])["identical"] is False
    assert sim_ab.summary([_run(1.0, "b"), _run(1.0, "a")], old)["identical"] is False


def test_a_side_imports_the_package_of_its_own_source(tmp_path: Path) -> None:
    root = sim_ab.package_root(ROOT, tmp_path)
    probe = "import kvcompass, kvcompass.loadgen.sim as s; print(kvcompass.__file__, s.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(root), "PATH": ""},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out == [
        str(tmp_path / "kvcompass" / "__init__.py"),
        str(tmp_path / "kvcompass" / "loadgen" / "sim" / "__init__.py"),
    ]


def test_the_working_tree_against_itself_is_identical() -> None:
    """End to end, in processes of their own: 30 short requests, one pair."""
    command = [sys.executable, str(ROOT / "bench" / "sim_ab.py")]
    args = ["--against", "worktree", "--workload", "short", "--requests", "30", "--pairs", "1"]
    done = subprocess.run(command + args, check=True, capture_output=True, text=True)
    report = json.loads(done.stdout)
    short = report["short"]
    assert short["identical"] is True
    assert short["requests"] == 30
    assert len(short["old_cpu_s"]) == len(short["new_cpu_s"]) == 1
    assert short["ratio"] > 0
    assert "mixed" not in report


def test_an_unknown_revision_stops_with_one_line() -> None:
    command = [sys.executable, str(ROOT / "bench" / "sim_ab.py"), "--against", "no-such-rev"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.startswith("cannot take revision 'no-such-rev'")
    assert "Traceback" not in done.stderr


def test_an_exported_revisions_cython_modules_are_compiled_in_place(tmp_path: Path) -> None:
    package = tmp_path / "shared" / "kvc_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = "# cython: language_level=3\ndef answer():\n    return 42\n"
    (package / "answer.pyx").write_text(source)
    sim_ab.build_compiled(tmp_path / "shared")
    probe = "import kvc_probe.answer as a; print(a.answer(), a.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(tmp_path / "shared")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == "42"
    assert out[1].endswith(".so")


def test_a_revision_with_mypyc_modules_is_built_by_its_own_setup(tmp_path: Path) -> None:
    """Its install compiles them (Cython and mypyc): so does the export, with its setup.py;
    an older revision names none, and its .pyx are compiled as before."""
    (tmp_path / "pyproject.toml").write_text('[tool.kvcompass]\nmypyc = ["loadgen/x.py"]\n')
    (tmp_path / "setup.py").write_text(
        "import sys, pathlib\npathlib.Path('argv').write_text(' '.join(sys.argv[1:]))\n"
    )
    assert sim_ab.mypyc_sources(tmp_path) == ["loadgen/x.py"]
    sim_ab.build_in_place(tmp_path)
    assert (tmp_path / "argv").read_text() == "-q build_ext --inplace"
    (tmp_path / "setup.py").write_text("raise SystemExit('no compiler')\n")
    with pytest.raises(SystemExit, match="no compiler"):
        sim_ab.build_in_place(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "old"\n')
    assert sim_ab.mypyc_sources(tmp_path) == []
