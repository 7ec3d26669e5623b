"""``kvcompass report all``: every artefact once, in an order that lets later ones reuse
earlier runs, with each PNG copied to ``--figures``."""

from __future__ import annotations

import argparse
import errno
from importlib import import_module
from pathlib import Path

import pytest

from kvcompass.loadgen.reports import cli
from kvcompass.loadgen.reports.common import Artefact
from kvcompass.loadgen.reports.fig2 import TRACES


def test_all_makes_every_artefact_once_fig12_before_its_readers_and_copies_pngs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []

    def fake(name: str) -> cli.Maker:
        def make(args: argparse.Namespace) -> Artefact:
            made.append(name)
            (args.out / f"{name}.png").write_bytes(b"png")
            return Artefact(name, ["x"], [{"x": 1}])

        return make

    fakes = {name: (what, fake(name)) for name, (what, _) in cli.ARTEFACTS.items()}
    monkeypatch.setattr(cli, "ARTEFACTS", fakes)
    out, figures = tmp_path / "out", tmp_path / "figures"
    out.mkdir()
    traces = _traces(tmp_path)
    argv = ["all", "--out", str(out), "--figures", str(figures), "--traces", str(traces)]
    assert cli.main(argv) == 0
    assert sorted(made) == sorted(cli.ARTEFACTS)
    readers = ("headline", "fig13", "fig14", "table5")
    assert made.index("fig12") < min(made.index(n) for n in readers)
    assert made.index("headline") < made.index("margin")
    assert max(made.index(n) for n in ("fig12", "fig16", "margin")) < made.index("shipped-grid")
    assert made.index("shipped-grid") < made.index("price")
    assert sorted(p.name for p in figures.iterdir()) == sorted(f"{n}.png" for n in made)


def _traces(tmp_path: Path) -> Path:
    """A folder holding (empty) files of the Mooncake traces' names."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in TRACES:
        (folder / name).write_bytes(b"")
    return folder


@pytest.mark.parametrize("artefact", ["fig2", "fig5b", "all"])
def test_a_traces_folder_without_the_traces_stops_before_any_artefact(
    artefact: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    made: list[str] = []

    def make(args: argparse.Namespace) -> Artefact:
        made.append("x")
        return Artefact("x", ["x"], [{"x": 1}])

    monkeypatch.setattr(cli, "ARTEFACTS", dict.fromkeys(cli.ARTEFACTS, ("", make)))
    folder = _traces(tmp_path)
    (folder / TRACES[1]).unlink()
    argv = [artefact, "--out", str(tmp_path / "out"), "--traces", str(folder)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"kvcompass report: --traces {folder}: no {TRACES[1]} there")
    assert made == []
    # $KVC_TRACES stands in for the flag; a folder with both traces is taken.
    monkeypatch.setenv("KVC_TRACES", str(tmp_path / "nowhere"))
    assert cli.main([artefact, "--out", str(tmp_path / "out")]) == 2
    assert "--traces " + str(tmp_path / "nowhere") in capsys.readouterr().err
    (folder / TRACES[1]).write_bytes(b"")
    assert cli.main(argv) == 0
    assert made


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["table4", "--workloads", "lmsys"], "--workloads is read only by fig12 and fig16"),
        (["fig9", "--traces", "t"], "--traces is read only by fig2 and fig5b"),
    ],
)
def test_an_option_the_artefact_never_reads_stops_before_it_runs(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    made: list[argparse.Namespace] = []

    def make(args: argparse.Namespace) -> Artefact:
        made.append(args)
        return Artefact("x", ["x"], [{"x": 1}])

    monkeypatch.setattr(cli, "ARTEFACTS", dict.fromkeys(cli.ARTEFACTS, ("", make)))
    assert cli.main([*argv, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"kvcompass report: {line} (and all), not by {argv[0]}"
    ]
    assert made == []
    # Where it is read, it is taken.
    assert cli.main(["fig16", "--workloads", "lmsys", "--out", str(tmp_path)]) == 0
    assert made[-1].workloads == ["lmsys"]


def test_one_artefact_without_figures_copies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make(args: argparse.Namespace) -> Artefact:
        return Artefact("fig9", ["x"], [{"x": 1}])

    monkeypatch.setitem(cli.ARTEFACTS, "fig9", ("", make))
    assert cli.main(["fig9", "--out", str(tmp_path)]) == 0
    assert list(tmp_path.iterdir()) == []


SIMULATED = (
    "fig9",
    "headline",
    "margin",
    "run-length",
    "fig13",
    "fig14",
    "fig15",
    "shipped-grid",
    "price",
    "peak",
    "table4",
)


@pytest.mark.parametrize("name", SIMULATED)
def test_a_simulator_report_runs_its_module_with_out_quick_and_jobs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = name.replace("-", "_")
    calls: list[tuple[Path, bool, int]] = []

    def run(out: Path, *, quick: bool, jobs: int) -> Artefact:
        calls.append((out, quick, jobs))
        return Artefact(name, ["x"], [])

    monkeypatch.setattr(import_module(f"kvcompass.loadgen.reports.{module}"), f"run_{module}", run)
    args = argparse.Namespace(out=tmp_path, quick=True, jobs=3)
    assert cli.ARTEFACTS[name][1](args).name == name
    assert calls == [(tmp_path, True, 3)]


def test_ctrl_c_in_an_artefact_stops_with_one_line_and_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: argparse.Namespace) -> Artefact:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.ARTEFACTS, "fig9", ("", interrupted))
    try:
        code = cli.main(["fig9", "--out", str(tmp_path)])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped kvcompass report with a traceback")
    assert code == 130
    assert capsys.readouterr().err.splitlines() == [
        f"kvcompass report: interrupted in fig9; the simulations finished so far are kept "
        f"under {tmp_path}: the same command runs the rest"
    ]


def test_a_full_disk_in_an_artefact_stops_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def disk_full(args: argparse.Namespace) -> Artefact:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(cli.ARTEFACTS, "fig9", ("", disk_full))
    try:
        code = cli.main(["fig9", "--out", str(tmp_path)])
    except OSError:
        pytest.fail("a full disk escaped kvcompass report with a traceback")
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"kvcompass report: fig9 stopped writing under {tmp_path}: [Errno 28] No space left "
        "on device; the simulations finished so far are kept: the same command runs the rest"
    ]
