"""Every command that writes results checks where before it starts: a path it cannot
use stops it with one line naming the flag and exit 2, not a traceback after the run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kvcompass.loadgen import cli as loadgen_cli
from kvcompass.loadgen import demo
from kvcompass.loadgen.outputs import output_file, output_folder
from kvcompass.loadgen.reports import cli as report_cli
from kvcompass.loadgen.sim import agreement
from kvcompass.loadgen.sim import cli as sim_cli

Main = Callable[[Sequence[str] | None], int]


def test_an_output_folder_is_made_with_its_parents(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    assert output_folder(folder) == folder
    assert folder.is_dir()
    assert output_folder(folder) == folder  # an existing folder is fine


def test_a_file_is_not_an_output_folder(tmp_path: Path) -> None:
    file = tmp_path / "taken"
    file.write_text("keep me")
    with pytest.raises(ValueError, match=r"^--figures .*taken: is a file, not a folder$"):
        output_folder(file, "--figures")
    with pytest.raises(ValueError, match=r"^--out .*taken/x: cannot make the folder"):
        output_folder(file / "x")
    assert file.read_text() == "keep me"


def test_an_output_file_gets_its_folder_and_is_left_unwritten(tmp_path: Path) -> None:
    path = tmp_path / "new" / "summary.json"
    assert output_file(path, "--summary-json") == path
    assert path.parent.is_dir()
    assert not path.exists()
    with pytest.raises(ValueError, match=r"^--json .*new: is a folder, not a file$"):
        output_file(path.parent, "--json")
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"^--out's folder .*summary.json: is a file"):
        output_file(path / "records.jsonl", "--out")


def _commands(taken: Path) -> dict[str, tuple[Main, list[str], str]]:
    """Each command, argv pointing one output flag at a file, and the flag's name."""
    bad = str(taken)
    live = str(taken.parent / "records-kvcompass.jsonl")
    return {
        "report --out": (report_cli.main, ["fig9", "--quick", "--out", bad], "--out"),
        "report --figures": (
            report_cli.main,
            ["fig9", "--out", str(taken.parent / "o"), "--figures", bad],
            "--figures",
        ),
        "sim run": (sim_cli.main, ["run", "--requests", "50", "--out", bad], "--out"),
        "sim sweep": (
            sim_cli.main,
            ["sweep", "--policies", "random", "--rates", "5", "--requests", "5", "--out", bad],
            "--out",
        ),
        "sim agree": (agreement.main, ["--live", live, "--json", f"{bad}/gaps.json"], "--json"),
        "demo": (demo.main, ["--seconds", "2", "--out", bad], "--out"),
        "loadgen --out": (
            loadgen_cli.main,
            ["--requests", "3", "--routers", "us=http://127.0.0.1:9", "--out", f"{bad}/r.jsonl"],
            "--out",
        ),
        "loadgen --summary-json": (
            loadgen_cli.main,
            [
                *("--requests", "3", "--routers", "us=http://127.0.0.1:9"),
                *("--summary-json", str(taken.parent)),
            ],
            "--summary-json",
        ),
    }


@pytest.mark.parametrize("command", list(_commands(Path("/x/taken"))))
def test_a_command_stops_before_its_work_with_one_line_naming_the_flag(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    main, argv, flag = _commands(taken)[command]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran: no table, no progress, no "wrote"
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvcompass "), lines[0]
    assert f": {flag}" in lines[0], lines[0]
    assert taken.read_text() == "keep me"
