"""``kvcompass demo`` checks every flag before it starts anything: a value without
meaning stops it with one line naming the setting, exit 2, and no stack, no folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcompass.loadgen import demo
from kvcompass.loadgen.scenario import DemoScenario


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--seconds", "0"], "seconds must be positive, got 0.0"),
        (["--rate", "-1"], "rate must be positive, got -1.0"),
        (["--time-scale", "0"], "time_scale must be positive, got 0.0"),
        (["--seed", "-1"], "seed must be >= 0, got -1"),
        (["--tau-ms", "0"], "tau_ms must be positive, got 0.0"),
        (["--lambda-max", "-1"], "lambda_max must be >= 0, got -1.0"),
        (["--remote-margin-rtt", "nan"], "remote_margin_rtt must be >= 0, got nan"),
        (["--seconds", "inf"], "seconds must be finite, got inf"),
        (["--lambda-max", "inf"], "lambda_max must be finite, got inf"),
    ],
)
def test_a_meaningless_flag_stops_the_demo_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    out = tmp_path / "demo"
    assert demo.main([*flags, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"kvcompass demo: {line}"]
    assert captured.out == ""
    assert not out.exists()


def test_the_defaults_make_a_valid_scenario() -> None:
    args = demo._parser().parse_args([])
    scenario = demo._scenario(args, args.topology)
    assert isinstance(scenario, DemoScenario)
    assert scenario.seconds > 0


def test_a_demo_in_which_no_request_arrives_stops_before_any_component_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1 ms at 3 req/s: the demo started its 19 components and compared two empty runs.
    out = tmp_path / "demo"
    assert demo.main(["--seconds", "0.001", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "kvcompass demo: no request arrives in --seconds 0.001 at --rate 3: nothing to "
        "compare (give more seconds or a higher rate)"
    ]
    assert captured.out == ""  # the banner comes after the check
    assert not (out / "scenario.json").exists()  # nothing for `sim agree` to read
    assert not (out / "logs").exists()
