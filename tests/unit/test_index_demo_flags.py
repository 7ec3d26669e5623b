"""``kvcompass index-demo`` refuses a setting without meaning in one line, exit 2."""

from __future__ import annotations

import pytest

from kvcompass.services.cli import main


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--entries", "0"], "--entries must be positive, got 0"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--fingerprint-bits", "-1"], "fingerprint_bits must be in 0..16, got -1"),
        (["--fingerprint-bits", "17"], "fingerprint_bits must be in 0..16, got 17"),
    ],
)
def test_a_meaningless_setting_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    assert main(["index-demo", "--entries", "100", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"kvcompass index-demo: {line}"]
    assert captured.out == ""


def test_ctrl_c_in_a_short_command_stops_it_with_one_line_and_exit_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("kvcompass.loadgen.index_demo.run_index_demo", interrupted)
    try:
        code = main(["index-demo", "--entries", "100"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped kvcompass index-demo with a traceback")
    assert code == 130
    assert capsys.readouterr().err.splitlines() == ["kvcompass index-demo: interrupted"]
