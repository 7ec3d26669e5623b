"""The edge router's HTTP API against stub workers on loopback and a stand-in policy:
forwarding and the kvc extension, feedback into the policy, streaming token by token,
retry then 502/503, OpenAI-style 4xx errors, tenancy, /v1/route, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kvcompass.index.layout import Tier
from kvcompass.loadgen.testing import poll_until
from kvcompass.services.health import Health
from kvcompass.services.router.app import RouterApp
from kvcompass.services.router.policy import (
    Candidate,
    Decision,
    Feedback,
    MigrationOrder,
    RegionQueues,
    RouteRequest,
)
from kvcompass.services.router.tenancy import Tenancy
from kvcompass.services.router.testing import StubWorker, free_port, serve_in_thread
from kvcompass.services.router.tokenizer import ByteTokenizer, chat_prompt
from kvcompass.services.router.upstream import Upstream
from kvcompass.services.router.views import IndexMode
from kvcompass.topology import Topology, load_builtin

TOPOLOGY = load_builtin("testbed-3region")
MODEL = TOPOLOGY.model.name
CONTEXT = TOPOLOGY.model.context_tokens
ID = {w.id: w.index for w in TOPOLOGY.workers}
KEYS = "key-a=tenant_a,key-b=tenant_b"
TIMEOUT_S = 1.0  # the router's upstream timeouts in these tests


@dataclass
class StandInPolicy:
    """Picks ``order[0]``, falls back to ``order[1]``; claims half the prompt; records
    every call. No scoring: the routing core owns that."""

    topology: Topology
    order: list[int]
    name: str = "stand-in"
    migration: MigrationOrder | None = None
    lookup_ms: float = 0.0
    requests: list[RouteRequest] = field(default_factory=list)
    observed: list[Feedback] = field(default_factory=list)
    forwards: list[tuple[int, float]] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    queues: list[RegionQueues] = field(default_factory=list)

    def decide(self, request: RouteRequest, explain: bool = False) -> Decision:
        self.requests.append(request)
        claimed = len(request.tokens) // 2
        candidates = tuple(
            Candidate(
                worker=i, worker_id=self.topology.workers[i].id,
                region=self.topology.workers[i].region, wan_ms=0.0, queue_ms=1.0 + rank,
                matched_tokens=claimed, tier=Tier.VRAM, belief=0.5, prefill_ms=4.0,
                reload_ms=0.0, score=10.0 + rank,
            )
            for rank, i in enumerate(self.order)
        )  # fmt: skip
        best = self.topology.workers[self.order[0]]
        return Decision(
            worker=best.index, worker_id=best.id, region=best.region, reason="stand-in",
            claimed_tokens=claimed, lam=1.0, candidates=candidates,
            fallbacks=tuple(self.order[1:]), migration=self.migration, lookup_ms=self.lookup_ms,
        )  # fmt: skip

    def observe(self, feedback: Feedback) -> None:
        self.observed.append(feedback)

    def on_queues(self, queues: RegionQueues) -> None:
        self.queues.append(queues)

    def on_forward(self, decision: Decision, expected_service_ms: float) -> None:
        self.forwards.append((decision.worker, expected_service_ms))

    def on_failure(self, worker: int) -> None:
        self.failures.append(worker)


@dataclass
class Edge:
    url: str
    policy: StandInPolicy
    stubs: dict[str, StubWorker]
    registry: CollectorRegistry
    #: Per discovery wait: (seconds, requests the stub workers had received by then).
    waits: list[tuple[float, int]]

    def post(
        self, path: str, body: object, key: str | None = "key-a", **kw: object
    ) -> httpx.Response:
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=10, **kw)  # type: ignore[arg-type]

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


class _LiveIndex:
    """The index status of a router whose views are always live."""

    mode: IndexMode = "live"

    def check(self) -> tuple[bool, str]:
        return True, ""

    def age_s(self) -> float:
        return 0.0


class Edges:
    """Builds routers over stub workers; every server stops at the end of the test."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack

    def __call__(
        self, order: list[str], *, modes: dict[str, str] | None = None, keys: str = KEYS,
        reused: int = 0, gate: threading.Semaphore | None = None, dead: tuple[str, ...] = (),
        slow: tuple[str, ...] = (),
    ) -> Edge:  # fmt: skip
        """Stubs for every worker of ``order`` except ``dead`` ones (a port nobody
        listens on); the policy picks ``order[0]`` then falls back to ``order[1]``."""
        stubs, urls = {}, {}
        for wid in order:
            if wid in dead:
                urls[ID[wid]] = f"http://127.0.0.1:{free_port()}"
                continue
            w = TOPOLOGY.workers[ID[wid]]
            stub = StubWorker(wid, w.region, (modes or {}).get(wid, "ok"), reused,
                              {wid: 12.5}, gate, 3 * TIMEOUT_S if wid in slow else 0.0)  # fmt: skip
            stubs[wid] = stub
            urls[ID[wid]] = self._stack.enter_context(serve_in_thread(stub.app()))
        policy = StandInPolicy(TOPOLOGY, [ID[w] for w in order])
        registry = CollectorRegistry()
        waits: list[tuple[float, int]] = []

        async def discovery_wait(seconds: float) -> None:
            waits.append((seconds, sum(len(s.requests) for s in stubs.values())))
            await asyncio.sleep(seconds)

        router = RouterApp(
            topology=TOPOLOGY, region="us", policy=policy,
            upstream=Upstream(urls, {w.index: w.id for w in TOPOLOGY.workers},
                              connect_timeout_s=1.0, request_timeout_s=TIMEOUT_S,
                              stream_idle_timeout_s=TIMEOUT_S),
            tenancy=Tenancy(keys), tokenizer=ByteTokenizer(), health=Health(),
            registry=registry, index=_LiveIndex(), max_body_bytes=1 << 20,
            discovery_wait=discovery_wait,
        )  # fmt: skip
        url = self._stack.enter_context(serve_in_thread(router.app))
        return Edge(url, policy, stubs, registry, waits)


@pytest.fixture
def edges() -> Iterator[Edges]:
    with contextlib.ExitStack() as stack:
        yield Edges(stack)


def completion(prompt: object = None, **kw: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": list(range(40)) if prompt is None else prompt, **kw}


# -- forwarding ------------------------------------------------------------------------


def test_a_completion_is_forwarded_with_the_kvc_extension_and_passed_through(
    edges: Edges,
) -> None:
    edge = edges(["us-1", "us-0"], reused=15)
    r = edge.post("/v1/completions", completion(max_tokens=3, temperature=0.5))
    assert r.status_code == 200, r.text
    assert r.headers["x-kvc-worker"] == "us-1"
    assert r.headers["x-kvc-region"] == "us"
    assert r.headers["x-kvc-reason"] == "stand-in"
    assert r.headers["x-kvc-claimed-tokens"] == "20"
    body = r.json()
    assert body["choices"][0]["text"] == "t0 t1 t2 "
    assert body["kvc"]["worker"] == "us-1"  # the worker's body, passed through
    [sent] = edge.stubs["us-1"].requests
    assert sent["prompt"] == list(range(40))
    assert sent["temperature"] == 0.5
    assert sent["max_tokens"] == 3
    assert sent["kvc"] == {
        "claimed_tokens": 20, "origin_region": "us", "namespace": "tenant_a",
        "request_id": r.headers["x-request-id"],
    }  # fmt: skip
    assert not edge.stubs["us-0"].requests


def test_the_workers_report_is_folded_back_into_the_policy(edges: Edges) -> None:
    edge = edges(["eu-0", "us-0"], reused=15)
    assert edge.post("/v1/completions", completion()).status_code == 200
    [fb] = edge.policy.observed
    assert (fb.worker, fb.claimed_tokens, fb.reused_tokens) == (ID["eu-0"], 20, 15)
    assert fb.cross_region
    assert fb.queue_vector is not None
    assert fb.queue_vector.region == "eu"
    assert dict(fb.queue_vector.queue_ms) == {ID["eu-0"]: 12.5}
    # pending work: the unpriced prefill (4 ms / (1 + λ=1)) on the chosen worker
    assert edge.policy.forwards == [(ID["eu-0"], 2.0)]
    assert edge.metric("kvc_router_cross_region_forwards_total", region="eu") == 1
    assert edge.metric("kvc_router_claimed_tokens_total") == 20
    assert edge.metric("kvc_router_false_claimed_tokens_total") == 5
    assert edge.metric("kvc_router_false_claim_rate") == pytest.approx(0.25)


def test_a_decisions_lookup_time_is_waited_out_before_the_request_is_forwarded(
    edges: Edges,
) -> None:
    edge = edges(["eu-0", "us-0"])
    edge.policy.lookup_ms = 300.0  # e.g. a DHT's hops
    start = time.perf_counter()
    assert edge.post("/v1/completions", completion()).status_code == 200
    assert time.perf_counter() - start >= 0.3
    assert edge.waits == [(0.3, 0)]  # waited once, before any worker saw the request
    assert len(edge.stubs["eu-0"].requests) == 1


def test_a_decision_without_lookup_time_is_forwarded_without_waiting(edges: Edges) -> None:
    edge = edges(["eu-0", "us-0"])
    assert edge.post("/v1/completions", completion()).status_code == 200
    assert edge.waits == []


def test_text_prompts_are_tokenised_bytewise(edges: Edges) -> None:
    edge = edges(["us-0"])
    assert edge.post("/v1/completions", completion("héllo")).status_code == 200
    assert edge.stubs["us-0"].requests[0]["prompt"] == list("héllo".encode())
    assert list(edge.policy.requests[0].tokens) == list("héllo".encode())


def test_chat_messages_use_the_template_and_answer_as_chat_completions(edges: Edges) -> None:
    edge = edges(["us-0"])
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = edge.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "t0 t1 "}
    want = list(chat_prompt([("system", "be brief"), ("user", "hi")]).encode())
    assert edge.stubs["us-0"].requests[0]["prompt"] == want


def test_a_migration_order_is_sent_to_its_target(edges: Edges) -> None:
    edge = edges(["us-0", "us-1", "eu-0"])
    edge.policy.migration = MigrationOrder(16, ID["us-1"], ID["us-0"], "copy")
    assert edge.post("/v1/completions", completion(), key="key-b").status_code == 200
    poll_until(lambda: edge.stubs["us-1"].migrations, 10, "the migration order")
    assert edge.stubs["us-1"].migrations == [
        {"prompt": list(range(16)), "namespace": "tenant_b", "mode": "copy", "source": "us-0"}
    ]
    edge.policy.migration = MigrationOrder(8, ID["eu-0"], None, "recompute")
    assert edge.post("/v1/completions", completion()).status_code == 200
    poll_until(lambda: edge.stubs["eu-0"].migrations, 10, "the cross-region order")
    assert edge.stubs["eu-0"].migrations == [
        {"prompt": list(range(8)), "namespace": "tenant_a", "mode": "recompute"}
    ]


# -- streaming -------------------------------------------------------------------------


def test_a_stream_passes_through_token_by_token(edges: Edges) -> None:
    gate = threading.Semaphore(0)
    edge = edges(["us-0"], reused=10, gate=gate)
    events: list[bytes] = []
    with httpx.stream(
        "POST", edge.url + "/v1/completions", json=completion(max_tokens=4, stream=True),
        headers={"authorization": "Bearer key-a"}, timeout=10,
    ) as r:  # fmt: skip
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-kvc-worker"] == "us-0"
        for line in r.iter_lines():
            if not line:
                continue
            events.append(line.encode())
            # The worker holds token i+1 until the client has seen token i: a router
            # that buffered the stream would deadlock here (and the test time out).
            gate.release()
    data = [json.loads(e[6:]) for e in events[:-1]]
    assert [d["choices"][0]["text"] for d in data] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert events[-1] == b"data: [DONE]"
    assert data[-1]["kvc"]["reused_tokens"] == 10
    [fb] = edge.policy.observed  # the last chunk's report
    assert (fb.claimed_tokens, fb.reused_tokens) == (20, 10)


def test_a_chat_stream_arrives_as_chat_completion_chunks(edges: Edges) -> None:
    edge = edges(["us-0"])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            "stream": True}  # fmt: skip
    r = edge.post("/v1/chat/completions", body)
    lines = [ln for ln in r.text.splitlines() if ln]
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 2
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "t0 "}
    assert chunks[1]["choices"][0]["delta"] == {"content": "t1 "}
    assert lines[-1] == "data: [DONE]"


# -- failures --------------------------------------------------------------------------


def test_a_failing_worker_is_retried_once_on_the_first_fallback(edges: Edges) -> None:
    edge = edges(["us-0", "us-1", "us-2"], modes={"us-0": "fail"})
    r = edge.post("/v1/completions", completion())
    assert r.status_code == 200
    assert r.headers["x-kvc-worker"] == "us-1"
    assert r.headers["x-kvc-reason"] == "fallback"
    assert edge.policy.failures == [ID["us-0"]]
    assert [w for w, _ in edge.policy.forwards] == [ID["us-0"], ID["us-1"]]
    assert not edge.stubs["us-2"].requests, "only one retry"
    assert edge.metric("kvc_router_upstream_failures_total", worker="us-0") == 1


def test_two_failing_workers_give_502_with_a_message(edges: Edges) -> None:
    edge = edges(["us-0", "us-1", "us-2"], modes={"us-0": "fail", "us-1": "fail"})
    r = edge.post("/v1/completions", completion())
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["type"] == "server_error"
    assert "us-0" in error["message"]
    assert "us-1" in error["message"]
    assert edge.policy.failures == [ID["us-0"], ID["us-1"]]
    assert not edge.stubs["us-2"].requests


def test_unreachable_workers_give_503(edges: Edges) -> None:
    edge = edges(["us-0", "us-1"], dead=("us-0", "us-1"))
    r = edge.post("/v1/completions", completion(stream=True))
    assert r.status_code == 503
    assert "no worker could be reached" in r.json()["error"]["message"]
    assert edge.policy.failures == [ID["us-0"], ID["us-1"]]


@pytest.mark.parametrize("stream", [False, True])
def test_a_hanging_worker_times_out_and_is_routed_around(edges: Edges, stream: bool) -> None:
    edge = edges(["us-0", "us-1"], slow=("us-0",))
    t0 = time.monotonic()
    r = edge.post("/v1/completions", completion(stream=stream))
    assert r.status_code == 200
    assert r.headers["x-kvc-worker"] == "us-1"
    assert time.monotonic() - t0 < TIMEOUT_S + 2
    assert edge.policy.failures == [ID["us-0"]]


def test_hanging_workers_give_503_within_the_timeouts(edges: Edges) -> None:
    edge = edges(["us-0", "us-1"], slow=("us-0", "us-1"))
    t0 = time.monotonic()
    r = edge.post("/v1/completions", completion())
    assert r.status_code == 503
    assert "timed out" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 2 * TIMEOUT_S + 2


def test_an_unreachable_worker_is_routed_around(edges: Edges) -> None:
    edge = edges(["us-0", "us-1"], dead=("us-0",))
    r = edge.post("/v1/completions", completion(stream=True))
    assert r.status_code == 200
    assert r.headers["x-kvc-worker"] == "us-1"


def test_a_workers_4xx_is_passed_through_without_retry(edges: Edges) -> None:
    edge = edges(["us-0", "us-1"], modes={"us-0": "reject"})
    r = edge.post("/v1/completions", completion())
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "stub rejects"
    assert not edge.stubs["us-1"].requests
    assert edge.policy.failures == []


# -- bad requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [
        (b"{not json", 400, "invalid_json", "not valid JSON"),
        (b"[1, 2]", 400, "invalid_json", "JSON object"),
        (completion(model="gpt-4"), 404, "model_not_found", "gpt-4"),
        ({"prompt": [1]}, 400, "invalid_value", "'model'"),
        (completion([]), 400, "empty_prompt", "empty"),
        (completion(""), 400, "empty_prompt", "empty"),
        (completion([1, -2]), 422, "invalid_value", "prompt[1]"),
        (completion([1, 1 << 32]), 422, "invalid_value", "prompt[1]"),
        (completion([1, 2.5]), 400, "invalid_value", "prompt[1]"),
        (completion([1, True]), 400, "invalid_value", "prompt[1]"),
        (completion([[1], [2]]), 400, "invalid_value", "batched"),
        (completion(7), 400, "invalid_value", "'prompt'"),
        (completion(max_tokens=0), 422, "invalid_value", "max_tokens"),
        (completion(max_tokens="5"), 400, "invalid_value", "max_tokens"),
        (completion(max_tokens=CONTEXT + 1), 422, "invalid_value", "max_tokens"),
        (completion(stream="yes"), 400, "invalid_value", "stream"),
        (completion([0] * (CONTEXT + 1)), 413, "context_length_exceeded",
         "context"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(
    edges: Edges, body: object, status: int, code: str, needle: str
) -> None:
    edge = edges(["us-0"])
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(edge.url + "/v1/completions", content=raw,
                   headers={"authorization": "Bearer key-a"}, timeout=10)  # fmt: skip
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"]
    assert not edge.stubs["us-0"].requests
    assert edge.metric("kvc_router_requests_total", endpoint="completions", status=str(status)) == 1


def test_a_body_over_the_limit_gets_413(edges: Edges) -> None:
    edge = edges(["us-0"])
    r = edge.post("/v1/completions", completion("x" * (2 << 20)))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize(
    ("messages", "needle"),
    [(None, "'messages'"), ([], "'messages'"), ([{"role": "user"}], "messages[0]"),
     (["hi"], "messages[0]")],
)  # fmt: skip
def test_bad_chat_messages_get_400(edges: Edges, messages: object, needle: str) -> None:
    edge = edges(["us-0"])
    r = edge.post("/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]


# -- tenancy ---------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic key-a", "key-a"])
def test_requests_without_a_valid_key_get_401(edges: Edges, authorization: str | None) -> None:
    edge = edges(["us-0"])
    headers = {} if authorization is None else {"authorization": authorization}
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/route"):
        r = httpx.post(edge.url + path, json=completion(), headers=headers, timeout=10)
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
    assert not edge.policy.requests
    assert not edge.stubs["us-0"].requests


def test_each_key_routes_in_its_own_namespace(edges: Edges) -> None:
    edge = edges(["us-0"])
    assert edge.post("/v1/completions", completion(), key="key-a").status_code == 200
    assert edge.post("/v1/completions", completion(), key="key-b").status_code == 200
    groups = [(r.namespace.model, r.namespace.group) for r in edge.policy.requests]
    assert groups == [(MODEL, "tenant_a"), (MODEL, "tenant_b")]
    sent = [s["kvc"]["namespace"] for s in edge.stubs["us-0"].requests]
    assert sent == ["tenant_a", "tenant_b"]


def test_without_keys_every_request_is_tenant_default(edges: Edges) -> None:
    edge = edges(["us-0"], keys="")
    assert edge.post("/v1/completions", completion(), key=None).status_code == 200
    assert edge.policy.requests[0].namespace.group == "default"


# -- route, status, metrics ------------------------------------------------------------


def test_route_answers_the_decision_with_every_candidates_terms(edges: Edges) -> None:
    edge = edges(["asia-1", "us-3"])
    r = edge.post("/v1/route", completion())
    assert r.status_code == 200
    d = r.json()
    assert (d["worker"], d["region"], d["reason"], d["claimed_tokens"]) == (
        "asia-1",
        "asia",
        "stand-in",
        20,
    )
    assert (d["origin_region"], d["namespace"], d["prompt_tokens"]) == ("us", "tenant_a", 40)
    assert d["fallbacks"] == ["us-3"]
    assert [c["worker"] for c in d["candidates"]] == ["asia-1", "us-3"]
    assert d["candidates"][1] == {
        "worker": "us-3", "index": ID["us-3"], "region": "us", "down": False, "score_ms": 11.0,
        "wan_ms": 0.0,
        "queue_ms": 2.0, "prefill_ms": 4.0, "reload_ms": 0.0, "matched_tokens": 20,
        "tier": "vram", "belief": 0.5, "pending": False,
    }  # fmt: skip
    assert not edge.stubs["asia-1"].requests, "route only decides"
    assert not edge.policy.forwards


def test_health_readiness_and_metrics(edges: Edges) -> None:
    edge = edges(["eu-1"])
    assert httpx.get(edge.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(edge.url + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["conditions"]["views"]["ok"] is True
    edge.post("/v1/completions", completion())
    text = httpx.get(edge.url + "/metrics").text
    for line in (
        'kvc_router_decisions_total{reason="stand-in",region="eu"} 1.0',
        "kvc_router_decision_seconds_count 1.0",
        'kvc_router_cross_region_forwards_total{region="eu"} 1.0',
        'kvc_router_belief{worker="eu-1"} 0.5',
        'kvc_router_queue_estimate_ms{worker="eu-1"} 1.0',
        'kvc_router_requests_total{endpoint="completions",status="200"} 1.0',
        "kvc_router_false_claim_rate 1.0",
    ):
        assert line in text, line
