"""The live request path end to end: real broker and Redis, the MU, one edge (replayer +
router) per region, the emulated workers of testbed-3region and the WAN proxy, all as
separate processes (``kvcompass.loadgen.stack``), driven over HTTP as a client would.

Time runs 10x fast (workers' cost model and the WAN proxy), so emulated milliseconds in
the routers' scores and the workers' timings are 10x the real ones.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kvcompass.loadgen.stack import LocalStack, StackConfig
from kvcompass.loadgen.testing import poll_until
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")
MODEL = TOPOLOGY.model.name
KEYS = {"key-a": "tenant_a", "key-b": "tenant_b"}
SCALE = 0.1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    config = StackConfig(
        topology=TOPOLOGY,
        topology_ref="testbed-3region",
        workdir=tmp_path_factory.mktemp("stack"),
        shards=2,
        time_scale=SCALE,
        api_keys=KEYS,
        ready_timeout_s=90.0,
    )
    stack = LocalStack(config)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def _prompt(n: int, seed: int | None = None) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 120_000) for _ in range(n)]


def _post(
    url: str, body: dict[str, Any], key: str | None = "key-a"
) -> tuple[int, dict[str, str], bytes]:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, dict(reply.headers.items()), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def complete(
    stack: LocalStack, region: str, prompt: list[int], key: str = "key-a", max_tokens: int = 2
) -> tuple[dict[str, str], dict[str, Any]]:
    url = stack.router_urls[region] + "/v1/completions"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    status, headers, data = _post(url, body, key)
    assert status == 200, data
    return {k.lower(): v for k, v in headers.items()}, json.loads(data)


def route(stack: LocalStack, region: str, prompt: list[int], key: str = "key-a") -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt}
    status, _, data = _post(stack.router_urls[region] + "/v1/route", body, key)
    assert status == 200, data
    decision: dict[str, Any] = json.loads(data)
    return decision


def matched(decision: dict[str, Any]) -> dict[str, int]:
    """worker id -> matched tokens, for the candidates that match anything."""
    return {c["worker"]: c["matched_tokens"] for c in decision["candidates"] if c["matched_tokens"]}


def wait_indexed(
    stack: LocalStack, region: str, prompt: list[int], worker: str, key: str = "key-a"
) -> dict[str, Any]:
    """Until the edge of ``region`` sees ``worker`` holding a prefix of ``prompt``."""

    def seen() -> dict[str, Any] | None:
        decision = route(stack, region, prompt, key)
        return decision if worker in matched(decision) else None

    return poll_until(seen, 30, f"{worker} indexed at the {region} edge", interval=0.05)


def test_long_remote_match_is_forwarded_short_one_is_not(stack: LocalStack) -> None:
    long_prompt = _prompt(12_288, seed=1)
    headers, _ = complete(stack, "eu", long_prompt)
    holder = headers["x-kvc-worker"]
    assert headers["x-kvc-region"] == "eu"
    wait_indexed(stack, "us", long_prompt, holder)
    headers, body = complete(stack, "us", long_prompt)
    assert headers["x-kvc-worker"] == holder, headers
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 8_000

    short_prompt = _prompt(1_024, seed=2)
    headers, _ = complete(stack, "eu", short_prompt)
    assert headers["x-kvc-region"] == "eu"
    headers, _ = complete(stack, "us", short_prompt)
    assert headers["x-kvc-region"] == "us", "a 1K match cannot pay for 320 ms of WAN"


def _flood(stack: LocalStack, worker: str, prompts: list[list[int]]) -> list[threading.Thread]:
    """Send ``prompts`` straight to ``worker`` from background threads (not via a router)."""

    def send(prompt: list[int]) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        _post(stack.worker_url(worker) + "/v1/completions", body, key=None)

    threads = [threading.Thread(target=send, args=(p,), daemon=True) for p in prompts]
    for t in threads:
        t.start()
    return threads


def _worker_post(stack: LocalStack, worker: str, path: str, body: dict[str, Any]) -> bytes:
    status, _, data = _post(stack.worker_url(worker) + path, body, key=None)
    assert status in (200, 202), data
    return data


def test_saturated_holder_loses_to_an_idle_worker_that_recomputes(stack: LocalStack) -> None:
    prompt = _prompt(4_096, seed=3)
    headers, _ = complete(stack, "asia", prompt)
    holder = headers["x-kvc-worker"]
    wait_indexed(stack, "asia", prompt, holder)
    # ~16 s (emulated) of other prefill work queued at the holder.
    flood = _flood(stack, holder, [_prompt(16_000, seed=100 + i) for i in range(12)])

    def elsewhere() -> dict[str, Any] | None:
        d = route(stack, "asia", prompt)
        return d if d["worker"] != holder else None

    decision = poll_until(elsewhere, 20, "the router moving off the busy holder")
    by_id = {c["worker"]: c for c in decision["candidates"]}
    assert by_id[holder]["matched_tokens"] > 0  # it still holds the prefix...
    winner = by_id[decision["worker"]]
    assert winner["matched_tokens"] == 0  # ...and the winner recomputes
    assert winner["prefill_ms"] > 0
    assert by_id[holder]["queue_ms"] > winner["prefill_ms"]
    for t in flood:
        t.join(60)


def test_eviction_makes_a_worker_stop_being_chosen_for_that_prefix(stack: LocalStack) -> None:
    prompt = _prompt(2_048, seed=4)
    headers, _ = complete(stack, "us", prompt)
    holder = headers["x-kvc-worker"]
    wait_indexed(stack, "us", prompt, holder)
    assert route(stack, "us", prompt)["worker"] == holder
    _worker_post(stack, holder, "/admin/reset", {})
    poll_until(
        lambda: holder not in matched(route(stack, "us", prompt)),
        30,
        f"{holder}'s evictions reaching the us edge",
    )


def test_tenant_a_never_matches_tenant_b(stack: LocalStack) -> None:
    prompt = _prompt(2_048, seed=5)
    headers, _ = complete(stack, "asia", prompt, key="key-a")
    holder = headers["x-kvc-worker"]
    wait_indexed(stack, "asia", prompt, holder, key="key-a")
    assert matched(route(stack, "asia", prompt, key="key-b")) == {}
    status, _, body = _post(
        stack.router_urls["asia"] + "/v1/route", {"model": MODEL, "prompt": prompt}, key="nope"
    )
    assert status == 401, body


def test_a_dram_hit_is_priced_as_the_score_says(stack: LocalStack) -> None:
    prompt = _prompt(4_096, seed=6)
    target = "us-5"
    _worker_post(
        stack,
        target,
        "/v1/migrate",
        {"prompt": prompt, "namespace": "tenant_a", "mode": "recompute"},
    )
    decision = wait_indexed(stack, "us", prompt, target)
    c = {c["worker"]: c for c in decision["candidates"]}[target]
    assert c["tier"] == "dram"
    gamma, beta = TOPOLOGY.gamma_ms_per_token, TOPOLOGY.worker(target).beta_ms_per_token
    effective = c["belief"] * c["matched_tokens"]
    assert c["reload_ms"] == pytest.approx(gamma * effective)
    assert c["prefill_ms"] == pytest.approx(
        (1 + decision["lambda"]) * beta * (len(prompt) - effective)
    )
    assert c["score_ms"] == pytest.approx(
        c["wan_ms"] + c["queue_ms"] + c["prefill_ms"] + c["reload_ms"]
    )


def test_streaming_arrives_token_by_token(stack: LocalStack) -> None:
    import http.client
    import time

    port = int(stack.router_urls["eu"].rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": MODEL, "prompt": _prompt(256, seed=7), "max_tokens": 40, "stream": True}
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps(body),
        {"content-type": "application/json", "authorization": "Bearer key-a"},
    )
    reply = conn.getresponse()
    assert reply.status == 200
    assert reply.getheader("content-type", "").startswith("text/event-stream")
    events: list[tuple[float, str]] = []
    while True:
        line = reply.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append((time.monotonic(), line[6:].decode().strip()))
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(texts) == 40
    # 40 decode steps of >= 9 ms emulated (0.9 ms real) cannot arrive in one burst.
    assert events[-2][0] - events[0][0] > 39 * 9.0 * SCALE / 1000
    assert chunks[-1]["usage"]["completion_tokens"] == 40
