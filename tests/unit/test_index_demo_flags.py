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


def test_more_entries_than_memory_holds_are_refused_before_building(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kvcompass.loadgen.index_demo.available_memory", lambda: 1 << 20)
    assert main(["index-demo", "--entries", "1000"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "kvcompass index-demo: --entries 1,000 needs about 0.3 GiB (~300 bytes per entry); "
        "0.0 GiB is available here, enough for about 0"
    ]
    assert captured.out == ""


def test_the_memory_check_names_how_many_entries_fit() -> None:
    from kvcompass.loadgen.index_demo import BASE_BYTES, BYTES_PER_ENTRY, check_fits

    check_fits(1_000_000, None)  # unknown memory: not checked
    fits = BASE_BYTES + BYTES_PER_ENTRY * 1_000_000
    check_fits(1_000_000, fits)
    with pytest.raises(ValueError, match=r"enough for about 999,999$"):
        check_fits(1_000_000, fits - 1)
