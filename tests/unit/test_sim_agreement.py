"""The sim-vs-live comparison: zero gap against itself, it flags a real difference, and
the serving overhead it measures is the one a live run paid."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvcompass.loadgen.demo import default_scenario, demo_workload
from kvcompass.loadgen.records import RequestRecord, write_record
from kvcompass.loadgen.scenario import DemoScenario
from kvcompass.loadgen.sim import SimConfig, SimRecord, simulate
from kvcompass.loadgen.sim.agreement import compare, measured_overhead, scenario_of
from kvcompass.loadgen.sim.agreement import main as agreement_main
from kvcompass.loadgen.sim.fingerprint import code_fingerprint
from kvcompass.loadgen.sim.testing import shared_prefixes
from kvcompass.routing.testing import TOY
from kvcompass.topology import load_builtin

RECORDS = simulate(SimConfig(TOY, seed=2), shared_prefixes(TOY, 20.0, 120, seed=2)).records


def as_live(rec: SimRecord, slower: float = 1.0, plus_ms: float = 0.0) -> RequestRecord:
    """What the load generator would have written for the same outcome."""
    return RequestRecord(
        request_id=rec.request_id,
        session=rec.session,
        origin=rec.origin,
        tenant=rec.tenant,
        scheduled_s=rec.arrival_s,
        late_ms=0.0,
        prompt_tokens=rec.prompt_tokens,
        max_tokens=rec.output_tokens,
        status=200,
        worker=rec.worker,
        region=rec.worker_region,
        reason=rec.reason,
        claimed_tokens=rec.matched_tokens,
        reused_tokens=rec.reused_tokens,
        completion_tokens=rec.output_tokens,
        ttft_ms=rec.ttft_ms * slower + plus_ms,
        e2e_ms=rec.e2e_ms * slower + plus_ms,
    )


def test_identical_outcomes_have_no_gap() -> None:
    gaps, facts = compare(RECORDS, [as_live(r) for r in RECORDS])
    assert all(g.within and abs(g.gap) < 1e-9 for g in gaps)
    assert facts["joined"] == len(RECORDS)
    assert facts["same_worker_share"] == 1.0


def test_a_slower_live_run_is_outside_the_tolerance_and_time_scale_undoes_it() -> None:
    live = [as_live(r, slower=2.0) for r in RECORDS]
    gaps, _ = compare(RECORDS, live)
    outside = {g.metric for g in gaps if not g.within}
    assert outside == {"ttft_p50_ms", "ttft_p90_ms", "e2e_p50_ms"}
    scaled, _ = compare(RECORDS, live, time_scale=2.0)
    assert all(g.within for g in scaled)


def test_failed_live_requests_are_left_out() -> None:
    live = [as_live(r) for r in RECORDS]
    live[0] = dataclasses.replace(live[0], status=0, error="timeout")
    _, facts = compare(RECORDS, live)
    assert facts["joined"] == len(RECORDS) - 1
    assert facts["live_failed"] == 1


def test_the_overhead_is_the_median_excess_of_unqueued_requests_doing_the_same_work() -> None:
    unqueued = [r for r in RECORDS if r.queue_ms == 0]
    assert 10 < len(unqueued) < len(RECORDS)  # both kinds occur
    live = [as_live(r, plus_ms=13.0) for r in RECORDS]
    # A few live requests queued where the model did not: the median ignores them.
    for i in range(0, len(live), 5):
        live[i] = dataclasses.replace(live[i], ttft_ms=(live[i].ttft_ms or 0.0) + 500.0)
    # Requests the model queued, or that ran elsewhere or with other reuse live, say
    # nothing of the overhead: give them a huge excess, it must not count.
    queued = {r.request_id for r in RECORDS if r.queue_ms > 0}
    live = [
        dataclasses.replace(r, ttft_ms=(r.ttft_ms or 0.0) + 9e3) if r.request_id in queued else r
        for r in live
    ]
    live[1] = dataclasses.replace(live[1], worker="elsewhere", ttft_ms=9e3)
    live[2] = dataclasses.replace(live[2], reused_tokens=-1, ttft_ms=9e3)

    overhead, n = measured_overhead(RECORDS, live)
    assert overhead == pytest.approx(13.0)
    assert n == len(unqueued) - len({RECORDS[1].request_id, RECORDS[2].request_id} - queued)


def test_the_overhead_of_a_simulated_live_run_is_recovered() -> None:
    # Round-robin routes alike whatever the timing, so the "live" run (the simulator
    # paying 9 ms per request) does the same work as the paper's model.
    requests = shared_prefixes(TOY, 20.0, 120, seed=4)
    paper = simulate(SimConfig(TOY, policy="round-robin", seed=4), requests).records
    paid = simulate(
        SimConfig(TOY, policy="round-robin", seed=4, serving_overhead_ms=9.0), requests
    ).records
    overhead, n = measured_overhead(paper, [as_live(r) for r in paid])
    assert overhead == pytest.approx(9.0)
    assert n == sum(r.queue_ms == 0 for r in paper)
    # Against records that already pay an overhead the answer is the same: the whole of it.
    assert measured_overhead(paid, [as_live(r) for r in paid])[0] == pytest.approx(9.0)


def _recorded(folder: Path) -> DemoScenario:
    """A demo's scenario with its own topology file, as ``kvcompass demo`` writes it."""
    (folder / "mine-long-context.toml").write_text("# the demo's topology\n")
    scenario = dataclasses.replace(
        default_scenario(), topology="mine-long-context.toml", seed=11, prefix_chain=False
    )
    scenario.write(folder)
    return scenario


def test_agree_simulates_the_scenario_the_demo_recorded(tmp_path: Path) -> None:
    """The recorded topology (its file in the demo's folder), seed and settings win; a
    flag may restate them. Without a recording, the flags over the demo's defaults."""
    recorded = _recorded(tmp_path)
    assert scenario_of(DemoScenario.read(tmp_path), tmp_path, {}) == recorded
    assert recorded.topology_ref(tmp_path) == str(tmp_path / "mine-long-context.toml")
    restated = {"seed": 11, "topology": str(tmp_path / "mine-long-context.toml")}
    assert scenario_of(recorded, tmp_path, restated) == recorded
    empty = tmp_path / "old-demo"
    empty.mkdir()
    assert DemoScenario.read(empty) is None
    assert scenario_of(None, empty, {"seed": 3}) == dataclasses.replace(default_scenario(), seed=3)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--topology", "testbed-3region"], "--topology testbed-3region contradicts"),
        (["--no-prefix-chain", "--seed", "12"], "--seed 12 contradicts"),
    ],
)
def test_a_flag_contradicting_the_recorded_scenario_stops_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    _recorded(tmp_path)
    live = tmp_path / "records-kvcompass.jsonl"
    assert agreement_main(["--live", str(live), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"kvcompass sim agree: {named} the demo's ")
    assert err[0].endswith(f"recorded in {tmp_path / 'scenario.json'}: omit the flag")


def _valid_scenario_fields() -> dict[str, object]:
    return {
        "topology": "testbed-3region",
        "seconds": 6.0,
        "rate": 3.0,
        "seed": 3,
        "time_scale": 1.0,
        "remote_margin_rtt": 1.0,
        "pending_credit": True,
        "prefix_chain": True,
        "tau_ms": 10.0,
        "lambda_max": 80.0,
    }


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"topology": "x"}',
        json.dumps(_valid_scenario_fields() | {"seconds": 0}),
        json.dumps(_valid_scenario_fields() | {"tau_ms": -5}),
    ],
)
def test_a_corrupt_scenario_stops_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    (tmp_path / "scenario.json").write_text(text)
    live = tmp_path / "records-kvcompass.jsonl"
    assert agreement_main(["--live", str(live)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kvcompass sim agree: {tmp_path / 'scenario.json'} is not a demo")


def test_agree_on_a_demo_folder_compares_its_scenario_and_says_what_it_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A demo folder whose records are what the simulator itself gives its recorded
    scenario: every gap is zero, every request on the same worker, and the JSON names
    the scenario and the code."""
    scenario = dataclasses.replace(default_scenario(), seconds=6.0, seed=3)
    scenario.write(tmp_path)
    topology = load_builtin(scenario.topology)
    requests = demo_workload(topology, scenario.seconds, scenario.rate, scenario.seed)
    config = SimConfig(topology, policy="kvcompass", seed=scenario.seed)
    live = tmp_path / "records-kvcompass.jsonl"
    with live.open("w") as out:
        for rec in simulate(config, requests).records:
            write_record(out, as_live(rec))
    report = tmp_path / "agree.json"
    assert agreement_main(["--live", str(live), "--json", str(report)]) == 0
    written = json.loads(report.read_text())
    assert written["scenario"] == dataclasses.asdict(scenario)
    assert written["code"] == code_fingerprint()
    assert written["facts"]["same_worker_share"] == 1.0
    assert written["facts"]["joined"] == len(requests) > 0
    assert all(g["gap"] == 0 for g in written["gaps"]), written["gaps"]
    assert "same_worker_share 1.000" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--serving-overhead-ms", "-1"], "serving_overhead_ms must be >= 0, got -1.0"),
        (["--update-delay-ms", "-5", "--serving-overhead-ms", "1"], "update_delay_ms must be"),
    ],
)
def test_a_meaningless_simulation_flag_stops_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    dataclasses.replace(default_scenario(), seconds=2.0).write(tmp_path)
    live = tmp_path / "records-kvcompass.jsonl"
    live.write_text("")
    assert agreement_main(["--live", str(live), *flags]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"kvcompass sim agree: {line}"), err


def test_an_overhead_with_nothing_to_measure_says_how_many_live_requests_finished() -> None:
    # An empty records file (a demo that wrote nothing): the line says 0, not only that
    # no request matched.
    with pytest.raises(ValueError, match=r"\(of 0 finished live requests\)"):
        measured_overhead([], [])
