"""Arrival times from an Azure trace (order kept, scaled by speed, lengths optional),
origin regions by population share, and make_workload / the loadgen CLI by name."""

from __future__ import annotations

import gzip
import itertools
import json
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcompass.loadgen.cli import main
from kvcompass.loadgen.sim import cli as sim_cli
from kvcompass.loadgen.workloads import (
    WORKLOADS,
    LiveRequest,
    make_workload,
    read_azure,
    read_trace,
    workload_config,
)
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")
STAMPS = ["18:00:00.0000000", "18:00:00.2500000", "18:00:00.2500000", "18:00:01.7000000"]


def _input(i: int) -> int:
    return 3000 + 50 * (7 * i % 40)  # not in time order


@pytest.fixture
def azure(tmp_path: Path) -> Path:
    """A small Azure-format trace: 40 arrivals, uneven gaps, known lengths."""
    path = tmp_path / "azure.csv.gz"
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(0.4, 40))
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i, t in enumerate(times):
        minutes, seconds = divmod(float(t), 60.0)
        rows.append(f"2023-11-16 18:{int(minutes):02d}:{seconds:010.7f},{_input(i)},{7 + i}")
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    return path


def test_azure_reader_keeps_order_and_rejects_unsorted(tmp_path: Path, azure: Path) -> None:
    trace = read_azure(azure)
    assert len(trace) == 40
    assert trace.times_s[0] == 0.0
    assert np.all(np.diff(trace.times_s) > 0)
    assert trace.input_tokens.tolist() == [_input(i) for i in range(40)]
    assert trace.output_tokens[3] == 10
    unsorted = tmp_path / "bad.csv"
    unsorted.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 {s},10,1\n" for s in reversed(STAMPS))
    )
    with pytest.raises(ValueError, match="not sorted"):
        read_azure(unsorted)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("x,y\n1,2\n", r"bad.csv: not an Azure trace CSV: no column ContextTokens, "),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nnoon,5,5\n", r"TIMESTAMP is not a date"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,x,5\n", r"bad.csv:2: "),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,5\n", r"bad.csv:2: "),
    ],
)
def test_a_malformed_azure_trace_is_refused_naming_file_and_line(
    tmp_path: Path, text: str, needle: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    with pytest.raises(ValueError, match=needle):
        read_azure(bad)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (
            '{"not": "a record"}',
            r"bad.jsonl:2: not a Mooncake trace record \(no field 'timestamp'\)",
        ),
        (
            '{"timestamp": 1, "input_length": "x", "output_length": 3, "hash_ids": [1]}',
            "bad.jsonl:2:",
        ),
        ('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": 7}', "bad.jsonl:2:"),
        ("not json", r"bad.jsonl:2: not a Mooncake trace record"),
    ],
)
def test_a_malformed_mooncake_trace_is_refused_naming_file_and_line(
    tmp_path: Path, line: str, needle: str
) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}'
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{good}\n{line}\n")
    with pytest.raises(ValueError, match=needle):
        read_trace(bad)
    assert len(read_trace(bad, limit=1)) == 1  # a limit stops before the bad line


def test_azure_arrivals_into_a_workload_without_them_are_refused_in_one_line(
    azure: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--azure", str(azure), "--requests", "5", "--dry-run"]
    assert main([*argv, "--workload", "synthetic"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "kvcompass loadgen: --azure replays its arrivals into the mixed, wildchat, lmsys "
        "workloads, not synthetic (give --workload)"
    ]
    assert main([*argv, "--workload", "lmsys"]) == 0


def test_azure_options_given_to_a_trace_replay_are_refused_in_one_line(
    azure: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A trace replays its own arrivals: --azure was silently ignored.
    trace = ["--workload", "trace", "--trace", "t.jsonl", "--dry-run"]
    for option in (f"--azure={azure}", "--azure-lengths"):
        assert main([*trace, option]) == 2
        name = option.split("=")[0]
        assert capsys.readouterr().err.splitlines() == [
            f"kvcompass loadgen: {name} is read only by the mixed, wildchat and lmsys "
            "workloads, not by --workload trace"
        ]


@pytest.mark.parametrize("name", ["mixed", "wildchat", "lmsys"])
def test_azure_arrivals_are_the_trace_times_in_order_divided_by_speed(
    name: str, azure: Path
) -> None:
    times = read_azure(azure).times_s
    for speed in (1.0, 2.5):
        requests = list(make_workload(name, TOPOLOGY, None, 1, azure=str(azure), speed=speed))
        assert len(requests) == len(times)  # the trace ends the workload
        assert [r.at_s for r in requests] == pytest.approx((times / speed).tolist())


@pytest.mark.parametrize("rate", [["--rate", "5"], ["--set", "rate=5"]])
def test_a_rate_beside_azure_arrivals_is_refused_in_one_line(
    rate: list[str], azure: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The trace's times were replayed and the rate silently dropped.
    argv = ["--workload", "lmsys", "--azure", str(azure), "--dry-run"]
    assert main([*argv, *rate]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "kvcompass loadgen: a Poisson rate (--rate, --set rate=) is not read with --azure, "
        "whose arrivals are the trace's own (scale them with --speed)"
    ]
    sim = ["run", "--workload", "lmsys", "--azure", str(azure), "--topology", "testbed-3region"]
    assert sim_cli.main([*sim, "--rate", "5"]) == 2
    assert "is not read with --azure" in capsys.readouterr().err
    assert sim_cli.main(sim) == 0  # a cell with Azure arrivals still runs
    assert sim_cli.main(["sweep", *sim[1:], "--jobs", "1", "--out", str(azure.parent / "s")]) == 0


def test_azure_lengths_set_outputs_and_prompt_lengths_above_the_prefix(azure: Path) -> None:
    trace = read_azure(azure)
    requests = list(make_workload("lmsys", TOPOLOGY, None, 1, azure=str(azure), azure_lengths=True))
    assert [r.max_tokens for r in requests] == trace.output_tokens.tolist()
    # lmsys system prompts + openers are far below 3000 tokens: prompts are the trace's
    # length unless a conversation's history is already longer
    lengths = np.array([len(r.tokens) for r in requests])
    assert np.all(lengths >= trace.input_tokens)
    assert np.mean(lengths == trace.input_tokens) > 0.5
    with pytest.raises(ValueError, match="needs an azure trace"):
        make_workload("lmsys", TOPOLOGY, None, 1, azure_lengths=True)


@pytest.mark.parametrize("name", ["mixed", "wildchat", "lmsys"])  # synthetic: test_workloads
def test_origin_regions_follow_population_shares_per_session(name: str) -> None:
    weights = (8.0, 2.0, 4.0)  # the testbed's us / eu / asia worker counts, reordered below
    requests = list(
        itertools.islice(
            make_workload(name, TOPOLOGY, 100.0, 5, region_weights=weights[::-1]), 12_000
        )
    )
    region_of: dict[str, str] = {}
    for r in requests:
        assert region_of.setdefault(r.session, r.origin_region) == r.origin_region
    counts = Counter(region_of.values())
    names = [region.name for region in TOPOLOGY.regions]
    expected = np.array(weights[::-1]) / sum(weights)
    observed = np.array([counts[n] for n in names]) / len(region_of)
    assert len(region_of) > 2000
    assert observed == pytest.approx(expected, abs=0.03)


def test_every_workload_by_name_and_trace_by_path(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    records = [
        {"timestamp": 1000 * i, "input_length": 600, "output_length": 4, "hash_ids": [0, 1 + i]}
        for i in range(5)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    for name in WORKLOADS:
        params: dict[str, Any] = {"trace": trace} if name == "trace" else {}
        first: list[LiveRequest] = list(
            itertools.islice(make_workload(name, TOPOLOGY, None, 0, **params), 5)
        )
        assert len(first) == 5, name
        assert all(r.tokens for r in first), name
        # uint32 arrays, which the simulator reads without converting them
        assert all(isinstance(r.tokens, array) and r.tokens.typecode == "I" for r in first)
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("sharegpt", TOPOLOGY)
    with pytest.raises(ValueError, match="needs trace=PATH"):
        make_workload("trace", TOPOLOGY)


@pytest.mark.parametrize("name", ["mixed", "wildchat", "lmsys", "synthetic"])
def test_loadgen_command_line_runs_each_workload(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workload", name, "--rate", "50", "--requests", "300", "--dry-run"]
    assert main([*argv, "--set", "seed=4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("requests 300 over ")
    assert main(["--workload", name, "--dry-run"]) == 2  # endless without a bound
    assert "endless" in capsys.readouterr().err


def test_readme_documents_every_generated_workload_parameter() -> None:
    readme = (Path(__file__).resolve().parents[2] / "loadgen" / "README.md").read_text()
    for param, default, _ in workload_config("mixed").parameters():
        assert f"| `{param}` | `{default!r}` |" in readme, param
    lmsys = {param: default for param, default, _ in workload_config("lmsys").parameters()}
    for param, default, _ in workload_config("wildchat").parameters():
        both = f"| `{param}` | `{default!r}` | `{lmsys[param]!r}` |"
        assert f"| `{param}` | `{default!r}` |" in readme or both in readme, param


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--requests", "0"], "--requests must be at least 1, got 0"),
        (["--duration", "-1"], "--duration must be positive, got -1.0"),
        (["--seed", "-1"], "--seed must be at least 0, got -1"),
        (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be at least 1, got 0"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
        (["--speed", "0", "--azure", "x.csv", "--workload", "mixed"], "--speed must be positive"),
        (["--timeout", "0", "--routers", "us=http://127.0.0.1:9"], "timeout must be positive"),
        (["--timeout", "inf", "--routers", "us=http://127.0.0.1:9"], "timeout must be positive"),
        (["--rate", "inf"], "--rate must be finite, got inf"),
        (["--max-in-flight", "0", "--routers", "us=http://127.0.0.1:9"], "max_in_flight must"),
        (["--routers", "us=notaurl"], "router us=notaurl is not an http(s)://host:port URL"),
        (["--routers", "mars=http://127.0.0.1:9"], "--routers names no region of testbed-3reg"),
    ],
)
def test_a_setting_without_meaning_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    bounded = [] if "--requests" in flags or "--duration" in flags else ["--requests", "5"]
    dry = [] if "--routers" in flags else ["--dry-run"]
    assert main([*flags, *bounded, *dry]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (err,) = captured.err.splitlines()
    assert err.startswith(f"kvcompass loadgen: {line}"), err


@pytest.mark.parametrize(
    ("workload", "value", "line"),
    [
        ("synthetic", "turns_mean=nan", "synthetic parameter turns_mean must be finite, got nan"),
        ("wildchat", "turns_mean=inf", "wildchat parameter turns_mean must be finite, got inf"),
        ("synthetic", "document_zipf=-1", "document_zipf must be >= 0, got -1.0"),
        ("synthetic", "rate=inf", "rate must be finite, got inf"),
        ("mixed", "tool_latency_s=-1", "tool_latency_s must be >= 0, got -1.0"),
        ("mixed", "agent_steps_mean=0", "agent_steps_mean must be >= 1, got 0.0"),
        ("mixed", "tool_set_zipf=-1", "tool_set_zipf must be >= 0, got -1.0"),
        ("wildchat", "system_tokens_cv=-1", "system_tokens_cv must be >= 0, got -1.0"),
        ("lmsys", "answer_tokens_cv=-1", "answer_tokens_cv must be >= 0, got -1.0"),
        # Each of these printed Python's own words, naming no parameter.
        ("mixed", "tool_sets=0.5", "mixed parameter tool_sets must be a whole number, got '0.5'"),
        ("lmsys", "turns_mean=two", "lmsys parameter turns_mean must be a number, got 'two'"),
        (
            "mixed",
            "azure_lengths=2",
            "mixed parameter azure_lengths must be true or false, got '2'",
        ),
        ("mixed", "query_tokens_mean=0", "query_tokens_mean must be >= 1 (tokens), got 0.0"),
        ("lmsys", "opener_tokens_mean=0.5", "opener_tokens_mean must be >= 1 (tokens), got 0.5"),
        ("lmsys", "opener_zipf=-1", "opener_zipf must be >= 0, got -1.0"),
        ("mixed", "seed=-1", "--set seed must be at least 0, got -1"),
        ("mixed", "seed=0.5", "--set seed must be a whole number, got '0.5'"),
        ("mixed", "rate=fast", "--set rate must be a number, got 'fast'"),
        ("lmsys", "azure=/nowhere.csv", "--set azure /nowhere.csv: no such file"),
        # These read "bad catalog: size 50, length (800.0, 0.5, 128, 100)", or "empty prompt".
        (
            "lmsys",
            "system_tokens_max=100",
            "need 1 <= system_tokens_min <= system_tokens_max <= 1048576, got 128 and 100",
        ),
        ("mixed", "template_tokens=2000000", "template_tokens must be <= 1048576, got 2000000"),
        (
            "wildchat",
            "opener_tokens_mean=200000",
            "opener_tokens_mean must be <= 131072, got 200000.0",
        ),
        ("synthetic", "max_prompt_tokens=0", "max_prompt_tokens must be >= 1, got 0"),
        # "Cannot take a larger sample than population", "high is out of bounds for
        # uint32", and a synthetic workload that took 16 GB and never started.
        ("mixed", "tool_sets=2000000", "tool_sets must be <= 1048576, got 2000000"),
        # These drew 12 GB in 40 s for 20 requests, or did not finish in a minute.
        (
            "synthetic",
            "user_tokens_max=10000000",
            "user_tokens_max must be <= 1048576, got 10000000",
        ),
        (
            "synthetic",
            "documents_per_tenant=10000000",
            "documents_per_tenant must be <= 1048576, got 10000000",
        ),
        ("lmsys", "tenants=2000000", "tenants must be <= 1048576, got 2000000"),
        ("wildchat", "openers=2000000", "openers must be <= 1048576, got 2000000"),
        (
            "lmsys",
            "vocab=5000000000",
            "vocab must be <= 4294967296 (32-bit token ids), got 5000000000",
        ),
        (
            "synthetic",
            "tenants=100000000",
            "tenants × system_prompts_per_tenant × system_tokens_max must be <= 268,435,456 "
            "tokens, got 819,200,000,000",
        ),
    ],
)
def test_a_workload_parameter_without_meaning_is_refused_in_one_line(
    workload: str, value: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # NaN and inf reached numpy ("p contains NaNs") or drew silently; a negative Zipf
    # exponent made the least popular documents the hot ones.
    argv = ["--dry-run", "--requests", "5", "--workload", workload, "--set", value]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"kvcompass loadgen: {line}"
