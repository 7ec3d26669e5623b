"""The live driver against a tiny stand-in router (aiohttp, in a thread): records,
streaming TTFT, error records, open-loop sending, the summary and the command line."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from kvcompass.loadgen.cli import main
from kvcompass.loadgen.driver import DriverConfig, RunResult, drive
from kvcompass.loadgen.records import RequestRecord, read_records
from kvcompass.loadgen.summary import failures, render_side_by_side, summarize
from kvcompass.loadgen.workloads import LiveRequest
from kvcompass.services.wanproxy import WanProxy, plan_links
from kvcompass.topology import load_builtin

FAIL = 999_001  # a prompt starting with this gets a 503 with an OpenAI error body
CUT = 999_002  # ... a stream that ends without [DONE]
FIRST_CHUNK_S = 0.08  # the stand-in's prefill: first SSE chunk after this
STEP_S = 0.03  # then one chunk per generated token


@dataclass
class StandIn:
    """A router stand-in: serves ``worker`` from ``region``, reuses half the prompt."""

    worker: str = "eu-1"
    region: str = "eu"
    keys: dict[str, str] = field(default_factory=lambda: {"key-a": "tenant-a"})
    seen: list[tuple[float, dict[str, object], str]] = field(default_factory=list)
    url: str = ""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((time.perf_counter(), body, request.headers.get("authorization", "")))
        auth = request.headers.get("authorization", "").removeprefix("Bearer ")
        if auth not in self.keys:
            return _error(401, "invalid API key")
        prompt = body["prompt"]
        if prompt[0] == FAIL:
            return _error(503, "no worker available")
        n = body["max_tokens"]
        reused = len(prompt) // 2
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": n,
            "total_tokens": len(prompt) + n,
            "prompt_tokens_details": {"cached_tokens": reused},
        }
        headers = {
            "x-kvc-worker": self.worker,
            "x-kvc-region": self.region,
            "x-kvc-reason": "reuse",
            "x-kvc-claimed-tokens": str(reused + 16),
        }
        if not body.get("stream"):
            await asyncio.sleep(FIRST_CHUNK_S + n * STEP_S)
            return web.json_response({"object": "text_completion", "usage": usage}, headers=headers)
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(FIRST_CHUNK_S)
        for i in range(n):
            last = {"usage": usage, "kvc": {"worker": self.worker}} if i == n - 1 else {}
            chunk = {"choices": [{"text": f"t{i}", "index": 0}], **last}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if i < n - 1:
                await asyncio.sleep(STEP_S)
        if prompt[0] != CUT:
            await resp.write(b"data: [DONE]\n\n")
        return resp


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(body, status=status)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    server = StandIn()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", server.completions)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _request(
    i: int, at_s: float, first: int = 1, origin: str = "us", max_tokens: int = 4
) -> LiveRequest:
    tokens = [first, *range(2, 100 + i)]
    return LiveRequest(at_s, origin, "tenant-a", tokens, max_tokens, f"s{i}", f"r{i}")


def _run(
    requests: list[LiveRequest], routers: dict[str, str], stream: bool = True
) -> tuple[list[RequestRecord], RunResult]:
    records: list[RequestRecord] = []
    config = DriverConfig(
        routers, {"tenant-a": "key-a"}, "llama-3.1-8b", stream=stream, timeout_s=10
    )
    result = asyncio.run(asyncio.wait_for(drive(requests, config, records.append), 30))
    return sorted(records, key=lambda r: r.request_id), result


def test_records_carry_routing_usage_and_streaming_ttft(standin: StandIn) -> None:
    requests = [_request(0, 0.0), _request(1, 0.0, max_tokens=20)]
    records, result = _run(requests, {"us": standin.url})
    assert result.sent == 2
    first, second = records
    assert first.ok
    assert (first.worker, first.region, first.reason) == ("eu-1", "eu", "reuse")
    assert first.cross_region  # origin us, served in eu
    assert first.prompt_tokens == 99
    assert first.reused_tokens == 49
    assert first.claimed_tokens == 65
    assert first.completion_tokens == 4
    # TTFT: the first SSE chunk, after the stand-in's 80 ms prefill; E2E: 3 more steps.
    assert first.ttft_ms is not None
    assert first.e2e_ms is not None
    assert FIRST_CHUNK_S * 1000 <= first.ttft_ms < FIRST_CHUNK_S * 1000 + 500
    assert first.e2e_ms >= (FIRST_CHUNK_S + 3 * STEP_S) * 1000
    # 20 tokens: the first chunk at ~80 ms, the last ~570 ms later; TTFT is the first.
    assert second.ttft_ms is not None
    assert second.e2e_ms is not None
    assert second.e2e_ms >= (FIRST_CHUNK_S + 19 * STEP_S) * 1000
    assert second.ttft_ms + 200 < second.e2e_ms
    body = standin.seen[0][1]
    assert body["model"] == "llama-3.1-8b"
    assert body["stream"] is True
    assert isinstance(body["prompt"], list)
    assert {auth for _, _, auth in standin.seen} == {"Bearer key-a"}


def test_non_streaming_records_have_no_ttft(standin: StandIn) -> None:
    (record,), _ = _run([_request(0, 0.0)], {"us": standin.url}, stream=False)
    assert record.ok
    assert record.ttft_ms is None
    assert record.reused_tokens == 49
    assert record.e2e_ms is not None
    assert record.e2e_ms >= (FIRST_CHUNK_S + 4 * STEP_S) * 1000


def test_failures_become_error_records(standin: StandIn) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    requests = [
        _request(0, 0.0, first=FAIL),
        _request(1, 0.0, first=CUT),
        _request(2, 0.0, origin="eu"),  # eu's router is down
        _request(3, 0.0, origin="asia"),  # no router configured for asia
        LiveRequest(0.0, "us", "tenant-b", [1, 2, 3], 2, "s4", "r4"),  # no key: 401
        _request(5, 0.0),
    ]
    records, _ = _run(requests, {"us": standin.url, "eu": dead})
    by_id = {r.request_id: r for r in records}
    assert by_id["r0"].status == 503
    assert by_id["r0"].error == "HTTP 503: no worker available"
    assert by_id["r1"].status == 200
    assert by_id["r1"].error == "stream ended without [DONE]"
    assert by_id["r2"].status == 0
    assert by_id["r2"].error is not None
    assert "ClientConnectorError" in by_id["r2"].error
    assert by_id["r3"].error == "no router for region asia"
    assert by_id["r4"].status == 401
    assert by_id["r4"].error == "HTTP 401: invalid API key"
    assert [r.request_id for r in records if r.ok] == ["r5"]


def test_failed_requests_are_named_by_their_commonest_errors() -> None:
    def record(i: int, status: int, error: str | None) -> RequestRecord:
        return RequestRecord(f"r{i}", "s", "us", "t", 0.0, 0.0, 10, 2, status, error)

    records = [record(i, 503, "HTTP 503: busy") for i in range(3)]
    records += [record(3, 0, "timeout"), record(4, 200, None), record(5, 404, None)]
    assert failures(records[4:5]) is None
    assert failures(records) == (
        "5 of 6 requests failed: 3 × HTTP 503: busy; 1 × timeout; 1 × HTTP 404"
    )
    assert failures(records, shown=1) == (
        "5 of 6 requests failed: 3 × HTTP 503: busy; 2 other errors"
    )


def test_a_run_in_which_every_request_failed_exits_1_saying_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    routers = ",".join(f"{region}={dead}" for region in ("us", "eu", "asia"))
    assert main(["--requests", "2", "--set", "rate=50", "--routers", routers]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("2 of 2 requests failed: 2 × ClientConnectorError")
    assert err.splitlines() == ["kvcompass loadgen: every request failed (their errors are above)"]


def test_open_loop_sends_on_schedule_while_answers_are_pending(standin: StandIn) -> None:
    # Each answer takes ≥ 200 ms; requests are due every 50 ms. A closed loop would
    # send the 8th after ~1.4 s; open loop sends it at 350 ms.
    requests = [_request(i, 0.05 * i, max_tokens=5) for i in range(8)]
    records, result = _run(requests, {"us": standin.url})
    arrivals = sorted(t for t, _, _ in standin.seen)
    offsets = [t - arrivals[0] for t in arrivals]
    for i, offset in enumerate(offsets):
        # Not all at once (the slack: the first one may have been sent late).
        assert offset >= 0.05 * i - 0.04, offsets
    assert offsets[-1] < 0.35 + 0.4, offsets  # closed loop: ≥ 7 x 0.2 s = 1.4 s
    assert all(r.ok for r in records)
    assert max(r.late_ms for r in records) < 300
    assert result.duration_s < 0.35 + 0.2 + 1.0


def _rec(
    i: int, origin: str, region: str | None, ttft: float, e2e: float, **kw: object
) -> RequestRecord:
    fields: dict[str, object] = {
        "request_id": f"r{i}",
        "session": "s",
        "origin": origin,
        "tenant": "t",
        "scheduled_s": 0.0,
        "late_ms": 0.0,
        "prompt_tokens": 1000,
        "max_tokens": 10,
        "status": 200,
        "region": region,
        "reused_tokens": 600,
        "completion_tokens": 10,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
    }
    fields.update(kw)
    return RequestRecord(**fields)  # type: ignore[arg-type]


def test_summary_numbers() -> None:
    records = [_rec(i, "us", "us", ttft=float(i + 1), e2e=10.0 * (i + 1)) for i in range(100)]
    records += [
        _rec(100, "eu", "us", ttft=5.0, e2e=50.0),
        _rec(101, "eu", "eu", ttft=7.0, e2e=70.0, reused_tokens=None),
        _rec(102, "eu", None, ttft=1.0, e2e=1.0, status=503, error="HTTP 503: x"),
    ]
    summary = summarize("kvcompass", records, duration_s=10.0, regions=["us", "eu", "asia"])
    us, eu, asia, everyone = summary.regions
    assert [r.region for r in summary.regions] == ["us", "eu", "asia", "all"]
    assert us.ttft_p50_ms == pytest.approx(50.5)
    assert us.ttft_p99_ms == pytest.approx(99.01)
    assert us.e2e_p50_ms == pytest.approx(505.0)
    assert us.requests_per_s == pytest.approx(10.0)
    assert us.output_tokens_per_s == pytest.approx(100.0)
    assert (us.reused_tokens, us.recomputed_tokens, us.cross_region) == (60_000, 40_000, 0)
    assert us.reuse_ratio == pytest.approx(0.6)
    # eu: the failed request counts as an error and in no latency or token sum.
    assert (eu.requests, eu.ok, eu.errors, eu.cross_region) == (3, 2, 1, 1)
    assert (eu.reused_tokens, eu.recomputed_tokens) == (600, 1400)
    assert eu.ttft_p50_ms == pytest.approx(6.0)
    assert (asia.requests, asia.ttft_p50_ms) == (0, None)
    assert (everyone.requests, everyone.errors, everyone.cross_region) == (103, 1, 1)
    baseline = summarize("local-only", records[:100], duration_s=20.0, regions=["us", "eu"])
    table = render_side_by_side([summary, baseline])
    lines = table.splitlines()
    assert lines[0].split() == ["region", "metric", "kvcompass", "local-only"]
    ttft = next(line for line in lines if "TTFT" in line)  # the first region block: us
    assert ttft.split()[-6:] == ["50.5", "/", "99.0", "50.5", "/", "99.0"]
    row = next(line for line in lines if "throughput" in line)
    assert row.split()[-2:] == ["10.00", "5.00"]
    assert any(line.startswith("asia") for line in lines)


def test_command_line_writes_records_and_prints_the_summary(
    standin: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, summary = tmp_path / "records.jsonl", tmp_path / "summary.json"
    status = main(
        [
            "--requests", "12",
            "--rate", "40",
            "--seed", "3",
            "--set", "system_tokens_min=64,system_tokens_max=128",
            "--set", "document_share=0,new_session_prob=1",
            "--max-tokens", "3",
            "--routers", f"us={standin.url},eu={standin.url},asia={standin.url}",
            "--api-keys", "key-a=tenant-0,key-b=tenant-1",
            "--out", str(out),
            "--summary-json", str(summary),
            "--name", "kvcompass",
            "--no-progress",
        ]
    )  # fmt: skip
    assert status == 0
    records = list(read_records(out))
    assert len(records) == 12
    # The stand-in knows key-a only: tenant-0's requests pass, tenant-1's get 401.
    assert {r.tenant for r in records} == {"tenant-0", "tenant-1"}
    assert all(r.ok == (r.tenant == "tenant-0") for r in records)
    assert {r.status for r in records} == {200, 401}
    assert all(r.max_tokens <= 3 for r in records)
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["region", "metric", "kvcompass"]
    assert json.loads(summary.read_text())["regions"][-1]["requests"] == 12


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_leaves_the_replay_running_and_stops_the_command_with_one_line(
    standin: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """/dev/full refuses every write (ENOSPC): the records file is incomplete, but every
    request is still sent and summarised, and the command says so in one line."""
    status = main(
        [
            "--requests", "12",
            "--rate", "40",
            "--set", "system_tokens_min=64,system_tokens_max=128",
            "--max-tokens", "3",
            "--routers", f"us={standin.url},eu={standin.url},asia={standin.url}",
            "--out", "/dev/full",
            "--no-progress",
        ]
    )  # fmt: skip
    assert status == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "kvcompass loadgen: /dev/full is incomplete ([Errno 28] No space left on device); "
        "the summary above covers every request"
    ]
    sent = re.search(r"^all\s+requests \(errors\)\s+(\d+) \(", captured.out, re.M)
    assert sent is not None, captured.out
    assert sent.group(1) == "12", captured.out  # every request sent and summarised


def test_streaming_through_the_wan_proxy_pays_the_round_trip(standin: StandIn) -> None:
    """Origin asia → a worker in eu behind the WAN proxy (149 ms one way, scaled to
    25 ms): the first SSE chunk and the last arrive one round trip after the stand-in
    sent them."""
    topology = load_builtin("testbed-3region")
    host, port = standin.url.removeprefix("http://").split(":")
    links = plan_links(topology, {"eu-1": (host, int(port))}, origins=("asia",))
    scale = 25.0 / topology.wan_ms("asia", "eu")

    async def run() -> list[RequestRecord]:
        records: list[RequestRecord] = []
        async with WanProxy(
            topology, {"eu-1": (host, int(port))}, links, time_scale=scale
        ) as proxy:
            routers = {"asia": proxy.endpoints["asia"]["eu-1"]}
            config = DriverConfig(routers, {"tenant-a": "key-a"}, "m", timeout_s=10)
            requests = [_request(0, 0.0, origin="asia", max_tokens=5)]
            await asyncio.wait_for(drive(requests, config, records.append), 30)
        return records

    (record,) = asyncio.run(run())
    assert record.ok
    assert record.ttft_ms is not None
    assert record.e2e_ms is not None
    assert record.ttft_ms >= FIRST_CHUNK_S * 1000 + 2 * 25.0
    # The last chunk leaves the stand-in 4 steps after the first, then crosses the link.
    assert record.e2e_ms >= (FIRST_CHUNK_S + 4 * STEP_S) * 1000 + 2 * 25.0
    assert record.cross_region


def test_command_line_refuses_incomplete_arguments_and_describes_dry_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--duration", "5"]) == 2  # no --routers
    assert main(["--routers", "us=http://x"]) == 2  # the synthetic workload is endless
    assert main(["--workload", "trace", "--requests", "3", "--routers", "us=http://x"]) == 2
    errors = capsys.readouterr().err
    assert "--routers is required" in errors
    assert "endless" in errors
    assert "--trace PATH" in errors
    assert main(["--dry-run", "--requests", "30", "--set", "rate=10"]) == 0
    assert capsys.readouterr().out.startswith("requests 30 over ")


@pytest.mark.parametrize("command", ["loadgen", "sim"])
@pytest.mark.parametrize("value", ["nokey", "a=1,=2", "b="])
def test_a_set_that_is_not_name_value_is_a_usage_error_not_a_traceback(
    command: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcompass.loadgen.sim.cli import main as sim_main

    run, argv = (
        (main, ["--dry-run", "--requests", "3"])
        if command == "loadgen"
        else (sim_main, ["run", "--duration", "1"])
    )
    with pytest.raises(SystemExit) as stopped:
        run([*argv, "--set", value])
    assert stopped.value.code == 2
    bad = value.split(",")[-1]
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(f"error: argument --set: {bad!r} is not NAME=VALUE")
    )


def test_a_replay_in_which_no_request_arrives_stops_before_any_router_is_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 1 ms of a 1 req/s workload: the replay used to print a summary of zeros, exit 0.
    argv = ["--routers", "us=http://127.0.0.1:1", "--duration", "0.001", "--rate", "1"]
    assert main(argv) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith("kvcompass loadgen: no request arrives in the workload these options describe")
    )


@pytest.mark.parametrize(
    ("flag", "value", "problem"),
    [
        ("--routers", "us", "'us' is not NAME=VALUE"),
        ("--routers", "us=http://127.0.0.1:1,us=http://127.0.0.1:2", "'us' is given twice"),
        ("--api-keys", "nokey", "'nokey' is not NAME=VALUE"),
    ],
)
def test_a_pair_list_flag_names_its_bad_item(
    flag: str, value: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--requests", "2", flag, value])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"argument {flag}: {problem}")
