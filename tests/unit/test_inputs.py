"""A command told to read a file that is missing or a folder stops before any work with
one line naming the flag (it printed ``[Errno 2] No such file or directory``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kvcompass.loadgen import cli as loadgen_cli
from kvcompass.loadgen.inputs import input_file
from kvcompass.loadgen.sim import agreement
from kvcompass.loadgen.sim import cli as sim_cli

Main = Callable[[Sequence[str] | None], int]


def test_an_input_file_must_exist_and_be_a_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with pytest.raises(ValueError, match=r"^--trace .*trace.jsonl: no such file$"):
        input_file(path, "--trace")
    with pytest.raises(ValueError, match=r"^--grid .*: is a folder, not a file$"):
        input_file(tmp_path, "--grid")
    path.write_text("")
    assert input_file(path, "--trace") == path


def _commands(path: str) -> dict[str, tuple[Main, list[str]]]:
    """Each input flag of each command, pointed at ``path``."""
    return {
        "--trace": (loadgen_cli.main, ["--workload", "trace", "--trace", path, "--dry-run"]),
        "--azure": (loadgen_cli.main, ["--workload", "lmsys", "--azure", path, "--dry-run"]),
        "--grid": (sim_cli.main, ["sweep", "--grid", path, "--out", f"{path}-out"]),
        "--live": (agreement.main, ["--live", path]),
    }


@pytest.mark.parametrize("flag", list(_commands("x")))
@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_a_command_refuses_a_missing_or_folder_input_in_one_line(
    flag: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "input"
    if kind == "folder":
        path.mkdir()
    main, argv = _commands(str(path))[flag]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    why = "no such file" if kind == "missing" else "is a folder, not a file"
    assert err.splitlines() == [f"{err.split(':')[0]}: {flag} {path}: {why}"]
    assert err.startswith("kvcompass ")
    assert not (tmp_path / "input-out").exists()  # the sweep made no results folder
