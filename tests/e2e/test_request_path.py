"""The live request path end to end: real broker and Redis, the MU, one edge (replayer +
router) per region, the emulated workers of testbed-3region and the WAN proxy, all as
separate processes (``kvcompass.loadgen.stack``), driven over HTTP as a client would.

Time runs 10x fast (workers' cost model and the WAN proxy), so emulated milliseconds in
the routers' scores and the workers' timings are 10x the real ones.

The index has 16-bit fingerprints here. With the paper's keyless tables (no
fingerprints) a key nobody inserted reads whatever value its cell holds: in this stack
4 of 300 never-cached prompts showed a match somewhere, which made these exact
assertions fail now and then (a tenant "seeing" a worker, an evicted holder still
"matched"). Those structural false hits cost only a misroute, and they are measured
elsewhere (Table 5, the simulator's false lookups; false claims lose belief below).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

from kvcompass.loadgen.stack import LocalStack, StackConfig, read_metric
from kvcompass.loadgen.testing import poll_until
from kvcompass.topology import load_builtin, load_topology

FINGERPRINT_BITS = 16
TOPOLOGY = load_builtin("testbed-3region")
MODEL = TOPOLOGY.model.name
KEYS = {"key-a": "tenant_a", "key-b": "tenant_b"}
SCALE = 0.1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("stack")
    topology_file = workdir / "testbed-3region-fingerprinted.toml"
    builtin = resources.files("kvcompass").joinpath("topologies", "testbed-3region.toml")
    fingerprints = f"fingerprint_bits = {FINGERPRINT_BITS} "
    topology_file.write_text(builtin.read_text().replace("fingerprint_bits = 0 ", fingerprints))
    fingerprinted = load_topology(topology_file)
    assert fingerprinted.index.fingerprint_bits == FINGERPRINT_BITS
    config = StackConfig(
        topology=fingerprinted,
        topology_ref=str(topology_file),
        workdir=workdir,
        shards=2,
        time_scale=SCALE,
        api_keys=KEYS,
        ready_timeout_s=90.0,
        separate_workers=("us-7",),
        # A busy CI machine can deliver queue vectors more than the default 1 s late;
        # dropped as stale, the routers would never see a holder's queue.
        # Likewise the pending credit (0.5 s past the queue it was routed on by default):
        # the credit test must see it between two of its own HTTP calls.
        extra_env={"KVC_QUEUE_MAX_AGE_S": "5", "KVC_PENDING_SLACK_S": "5"},
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
    """worker id -> matched tokens, for the candidates the index says match anything
    (not the router's pending credit for a prefix it has just sent)."""
    return {
        c["worker"]: c["matched_tokens"]
        for c in decision["candidates"]
        if c["matched_tokens"] and not c["pending"]
    }


def wait_indexed(
    stack: LocalStack,
    region: str,
    prompt: list[int],
    worker: str,
    key: str = "key-a",
    idle: bool = False,
) -> dict[str, Any]:
    """Until the edge of ``region`` sees ``worker`` holding a prefix of ``prompt`` (and,
    with ``idle``, believes its queue empty: the index can arrive before the queue vector
    that says the prefill which cached the prefix has ended, up to Δ later)."""

    def seen() -> dict[str, Any] | None:
        decision = route(stack, region, prompt, key)
        if worker not in matched(decision):
            return None
        if idle and {c["worker"]: c for c in decision["candidates"]}[worker]["queue_ms"] != 0:
            return None
        return decision

    state = "indexed and idle" if idle else "indexed"
    return poll_until(seen, 30, f"{worker} {state} at the {region} edge", interval=0.05)


def test_long_remote_match_is_forwarded_short_one_is_not(stack: LocalStack) -> None:
    long_prompt = _prompt(12_288, seed=1)
    headers, _ = complete(stack, "eu", long_prompt)
    holder = headers["x-kvc-worker"]
    assert headers["x-kvc-region"] == "eu"
    wait_indexed(stack, "us", long_prompt, holder, idle=True)
    headers, body = complete(stack, "us", long_prompt)
    assert headers["x-kvc-worker"] == holder, headers
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 8_000

    short_prompt = _prompt(1_024, seed=2)
    headers, _ = complete(stack, "eu", short_prompt)
    assert headers["x-kvc-region"] == "eu"
    headers, _ = complete(stack, "us", short_prompt)
    assert headers["x-kvc-region"] == "us", "a 1K match cannot pay for 320 ms of WAN"


def _direct(stack: LocalStack, worker: str, prompt: list[int], tenant: str = "tenant_a") -> None:
    """A completion sent straight to ``worker`` (no router), so it caches ``prompt``."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "kvc": {"namespace": tenant}}
    status, _, data = _post(stack.worker_url(worker) + "/v1/completions", body, key=None)
    assert status == 200, data


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
    # A probe prompt every other asia worker holds: the router sends it to one of them,
    # and its answer piggybacks the region's queue vector, the holder's queue included.
    # Without it the router learns that queue only from broadcasts over the broker,
    # which a loaded machine delivered later than the flood below lasts: the holder's
    # cache cannot take more than ~5 s (real) of prefill work without evicting the
    # prompt, so the saturation cannot simply be made longer.
    probe = _prompt(256, seed=30)
    peers = [w.id for w in TOPOLOGY.region("asia").workers if w.id != holder]
    for peer in peers:
        _direct(stack, peer, probe)
    wait_indexed(stack, "asia", probe, peers[-1])
    # ~40 s (emulated; 4 s real) of other prefill work queued at the holder: the edge
    # must see it through the queue vectors while it lasts.
    flood = _flood(stack, holder, [_prompt(16_000, seed=100 + i) for i in range(30)])

    def elsewhere() -> dict[str, Any] | None:
        complete(stack, "asia", probe, max_tokens=1)
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
    # Whatever the index says, a worker's cache is per tenant: B reuses none of A's
    # blocks, while A, sent the same prompt again, reuses them.
    _, body = complete(stack, "asia", prompt, key="key-b")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    headers, body = complete(stack, "asia", prompt, key="key-a")
    assert headers["x-kvc-worker"] == holder
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(prompt) - 16
    status, _, data = _post(
        stack.router_urls["asia"] + "/v1/route", {"model": MODEL, "prompt": prompt}, key="nope"
    )
    assert status == 401, data


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


def test_a_prefix_just_sent_is_credited_before_the_index_knows_it(stack: LocalStack) -> None:
    """Pending credit on the live path: until the worker a prompt was sent to starts it,
    the index cannot know the prompt, but the router credits its own send, so a second
    request of it goes to the same worker and reuses it there."""
    worker = "us-7"  # a host of its own, so it can hang alone
    head = _prompt(2_048, seed=10)
    prompt = head + _prompt(2_048, seed=11)
    _direct(stack, worker, head)
    # 2,048 tokens indexed at us-7 and its queue seen empty: the prompt's best worker.
    assert wait_indexed(stack, "us", prompt, worker, idle=True)["worker"] == worker
    answers: list[tuple[dict[str, str], dict[str, Any]]] = []

    def send() -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.append(complete(stack, "us", prompt)))
        thread.start()
        return thread

    port = int(stack.router_urls["us"].rsplit(":", 1)[1])
    sample = 'kvc_router_decisions_total{reason="reuse-pending",region="us"}'
    before = read_metric(port, sample) or 0.0
    with stack.paused(f"workers-{worker}"):  # it starts nothing: no event can leave it
        first = send()

        def credited() -> dict[str, Any] | None:
            c = {c["worker"]: c for c in route(stack, "us", prompt)["candidates"]}[worker]
            return c if c["matched_tokens"] > len(head) else None

        candidate = poll_until(credited, 10, "the us router crediting its send", interval=0.01)
        assert candidate["pending"] is True  # the index still says 2,048
        assert candidate["matched_tokens"] == len(prompt)
        second = send()
        poll_until(
            lambda: (read_metric(port, sample) or 0.0) > before,
            10,
            "the second request decided on the pending credit",
            interval=0.01,
        )
    first.join(60)
    second.join(60)
    assert len(answers) == 2
    for headers, _ in answers:
        assert headers["x-kvc-worker"] == worker
    reasons = sorted(headers["x-kvc-reason"] for headers, _ in answers)
    assert reasons == ["reuse-local", "reuse-pending"]
    reused = sorted(body["usage"]["prompt_tokens_details"]["cached_tokens"] for _, body in answers)
    assert reused[0] >= len(head) - 16  # the first reused what the index said
    assert reused[1] >= len(prompt) - 16  # the second all that was sent before it


def _stream(port: int, body: dict[str, Any]) -> tuple[int, str, list[tuple[float, str]]]:
    """(status, content type, [(arrival time, data)] of every SSE event)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"content-type": "application/json", "authorization": "Bearer key-a"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    reply = conn.getresponse()
    events: list[tuple[float, str]] = []
    while line := reply.readline():
        if line.startswith(b"data: "):
            events.append((time.monotonic(), line[6:].decode().strip()))
    conn.close()
    return reply.status, reply.getheader("content-type", ""), events


def test_streaming_arrives_token_by_token(stack: LocalStack) -> None:
    port = int(stack.router_urls["eu"].rsplit(":", 1)[1])
    n = 200
    body = {"model": MODEL, "prompt": _prompt(256, seed=7), "max_tokens": n, "stream": True}
    # A process's first request pays one-off set-up (connections, first calls): its
    # tokens then leave in a catch-up burst. Measure the pace on a warm path.
    _stream(port, {**body, "max_tokens": 1})
    status, content_type, events = _stream(port, body)
    assert status == 200
    assert content_type.startswith("text/event-stream")
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(texts) == n
    # n decode steps of >= 9 ms emulated (0.9 ms real) each: a stream buffered anywhere
    # on the way would arrive in one burst. (Half the span: a loaded machine's event
    # loops may release a few overdue tokens together.)
    step_s = TOPOLOGY.model.decode_ms_per_step * SCALE / 1000
    assert events[-2][0] - events[0][0] > 0.5 * (n - 1) * step_s
    assert chunks[-1]["usage"]["completion_tokens"] == n


def test_a_worker_that_falsely_claims_caches_loses_belief_and_requests(
    stack: LocalStack,
) -> None:
    liar, honest = "us-0", "us-1"
    prompts = [_prompt(4_096, seed=200 + i) for i in range(8)]
    for p in prompts:
        _direct(stack, liar, p)  # the whole prompt...
        _direct(stack, honest, p[:2_048])  # ...and half of it, truly held
    wait_indexed(stack, "us", prompts[-1], liar)
    wait_indexed(stack, "us", prompts[-1], honest)
    # The liar's cache empties but the index never hears: every claim on it is false.
    _worker_post(stack, liar, "/admin/reset", {"publish_evictions": False})
    chosen = [complete(stack, "us", p)[0]["x-kvc-worker"] for p in prompts]
    # It wins while b·4096 > 2048 (belief EWMA 0.2: 1, .8, .64, .51 -> four claims),
    # then the honest half-holder wins every time.
    assert chosen[0] == liar
    assert chosen[-3:] == [honest] * 3, chosen
    assert chosen.count(liar) <= 5, chosen
    belief = {c["worker"]: c["belief"] for c in route(stack, "us", prompts[0])["candidates"]}
    assert belief[liar] < 0.5 < belief[honest]


def test_a_killed_worker_is_routed_around(stack: LocalStack) -> None:
    victim = "us-7"
    prompt = _prompt(4_096, seed=9)
    _direct(stack, victim, prompt)
    # Idle too: until the queue vector says its prefill ended, an idle equal worker wins.
    assert wait_indexed(stack, "us", prompt, victim, idle=True)["worker"] == victim
    stack.kill(f"workers-{victim}")
    # The first request still picks it, fails to connect, and is retried on the next
    # best worker; from then on the router treats it as down.
    for i in range(3):
        headers, _ = complete(stack, "us", prompt if i == 0 else _prompt(512, seed=300 + i))
        assert headers["x-kvc-worker"] != victim
    assert route(stack, "us", prompt)["worker"] != victim
    down = {c["worker"]: c for c in route(stack, "us", prompt)["candidates"]}[victim]
    assert down["down"]
    assert down["queue_ms"] is None
    # Its supervisor restarts it with an empty cache. It never sent the evictions, but
    # the new incarnation announces itself to every shard and the index drops what the
    # old one held: the edge stops matching the prefix on it.
    stack.restart(f"workers-{victim}")

    def forgotten() -> bool:
        return victim not in matched(route(stack, "us", prompt))

    poll_until(forgotten, 30, f"the index forgets what {victim} held before its restart")
