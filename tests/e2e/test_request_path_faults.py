"""Faults an operator can cause or suffer while the routers and workers serve requests,
on one whole stack (real broker, Redis and service processes, time 10x fast). Each test
states what must happen: keep serving, recover, or stop with one clear line.

The tests run in file order and share the stack; the broker's outage comes last, since
the embedded broker comes back without its log and the pipeline restarts around it.
"""

from __future__ import annotations

import json
import random
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
KEY = "key-a"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    config = StackConfig(
        topology=TOPOLOGY,
        topology_ref="testbed-3region",
        workdir=tmp_path_factory.mktemp("faults"),
        # The embedded broker auto-creates a topic it does not know with 4 partitions:
        # with 4 shards, a client that reaches the restarted broker before the topics
        # are created again cannot give kvc.events a wrong partition count.
        shards=4,
        time_scale=0.1,
        api_keys={KEY: "tenant_a"},
        ready_timeout_s=90.0,
        extra_env={
            "KVC_QUEUE_MAX_AGE_S": "5",
            # Quick to notice and to give up: the supervisor here is the test.
            "KVC_BROKER_TIMEOUT_S": "20",
            "KVC_SNAPSHOT_INTERVAL_S": "1",
        },
    )
    stack = LocalStack(config)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 120_000) for _ in range(n)]


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            head = {k.lower(): v for k, v in reply.headers.items()}
            return reply.status, head, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()


def complete(stack: LocalStack, region: str, prompt: list[int]) -> dict[str, str]:
    """A completion through ``region``'s router; it must be answered (the headers)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    status, headers, data = _post(stack.router_urls[region] + "/v1/completions", body)
    assert status == 200, data
    return headers


def route(stack: LocalStack, region: str, prompt: list[int]) -> dict[str, Any]:
    status, _, data = _post(
        stack.router_urls[region] + "/v1/route", {"model": MODEL, "prompt": prompt}
    )
    assert status == 200, data
    decision: dict[str, Any] = data
    return decision


def holders(decision: dict[str, Any]) -> dict[str, int]:
    """The index's matches (not the router's pending credit for what it has just sent)."""
    return {
        c["worker"]: c["matched_tokens"]
        for c in decision["candidates"]
        if c["matched_tokens"] and not c["pending"]
    }


def wait_indexed(stack: LocalStack, region: str, prompt: list[int], worker: str) -> None:
    poll_until(
        lambda: worker in holders(route(stack, region, prompt)),
        60,
        f"{worker} indexed at the {region} edge",
        interval=0.05,
    )


def readyz(stack: LocalStack, region: str) -> tuple[int, dict[str, Any]]:
    """(status, body) of the router's /readyz; (0, {}) while nothing answers."""
    try:
        with urllib.request.urlopen(stack.router_urls[region] + "/readyz", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def metric(stack: LocalStack, region: str, sample: str) -> float:
    """A sample (name with labels, as exposed) on ``region``'s router; 0 when absent."""
    with urllib.request.urlopen(stack.router_urls[region] + "/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            name, _, value = line.rpartition(" ")
            if name == sample:
                return float(value)
    return 0.0


def views_live(stack: LocalStack, region: str) -> bool:
    status, body = readyz(stack, region)
    assert status == 200, body  # whatever the index does, the gateway stays in service
    return bool(body["conditions"]["views"]["ok"])


def test_a_killed_router_comes_back_ready_and_routes_with_the_index(stack: LocalStack) -> None:
    prompt = _prompt(4_096, seed=1)
    holder = complete(stack, "eu", prompt)["x-kvc-worker"]
    wait_indexed(stack, "eu", prompt, holder)
    stack.kill("router-eu")
    stack.restart("router-eu")  # waits for /readyz 200
    headers = complete(stack, "eu", prompt)
    assert headers["x-kvc-worker"] == holder
    assert headers["x-kvc-index"] == "live"
    assert int(headers["x-kvc-claimed-tokens"]) == len(prompt)
    # A router that starts while its edge is down takes no traffic until it has the
    # index (its peers, if any, serve), then routes with it.
    stack.kill("edge-eu")
    stack.kill("router-eu")
    stack.restart("router-eu", wait=False)

    def answered() -> tuple[int, dict[str, Any]] | None:
        reply = readyz(stack, "eu")
        return reply if reply[0] else None

    status, body = poll_until(answered, 30, "the router answers")
    assert status == 503, body
    assert body["conditions"]["views"] == {
        "ok": False,
        "detail": body["conditions"]["views"]["detail"],
        "required": True,
    }
    stack.restart("edge-eu")
    poll_until(lambda: readyz(stack, "eu")[0] == 200, 30, "the router ready with its edge")
    assert complete(stack, "eu", prompt)["x-kvc-worker"] == holder


def test_a_dead_edge_degrades_routing_not_service_and_its_restart_restores_it(
    stack: LocalStack,
) -> None:
    prompt = _prompt(4_096, seed=2)
    holder = complete(stack, "asia", prompt)["x-kvc-worker"]
    wait_indexed(stack, "asia", prompt, holder)
    stack.kill("edge-asia")
    # No views at all now: every request is still answered, routed by load alone, and
    # the router says so (readiness stays 200: views_live asserts it).
    poll_until(lambda: not views_live(stack, "asia"), 10, "the router sees its edge gone")
    for seed in range(3):
        assert complete(stack, "asia", _prompt(512, seed=20 + seed))["x-kvc-index"] == "none"
    assert holders(route(stack, "asia", prompt)) == {}
    assert metric(stack, "asia", "kvc_router_index_live") == 0
    assert metric(stack, "asia", "kvc_router_index_age_seconds") > 0
    assert metric(stack, "asia", 'kvc_router_index_decisions_total{index="none"}') >= 3
    _, body = readyz(stack, "asia")
    assert body["conditions"]["views"]["required"] is False
    assert "last live" in body["conditions"]["views"]["detail"], body
    # The restarted edge bootstraps from the snapshots and replays: the holder is back.
    stack.restart("edge-asia")
    poll_until(lambda: views_live(stack, "asia"), 30, "the router sees its edge back")
    headers = complete(stack, "asia", prompt)
    assert (headers["x-kvc-worker"], headers["x-kvc-index"]) == (holder, "live")


def test_redis_gone_and_back_serving_goes_on_snapshots_resume_and_a_new_edge_bootstraps(
    stack: LocalStack,
) -> None:
    assert stack.infra is not None
    before = _prompt(4_096, seed=3)
    holder = complete(stack, "us", before)["x-kvc-worker"]
    wait_indexed(stack, "us", before, holder)
    stack.infra.kill("redis")
    # Routers, workers and the index pipeline do not need Redis to serve: a prefix
    # admitted during the outage still reaches the index.
    during = _prompt(4_096, seed=4)
    holder_during = complete(stack, "us", during)["x-kvc-worker"]
    wait_indexed(stack, "us", during, holder_during)
    assert complete(stack, "us", before)["x-kvc-worker"] == holder
    stack.infra.restart("redis")  # empty: every snapshot is gone
    # The MU writes its snapshots again (every second here), and an edge that starts
    # only now bootstraps from them and knows both prefixes.
    stack.kill("edge-us")
    stack.restart("edge-us")  # ready = every shard loaded from a snapshot and caught up
    poll_until(lambda: views_live(stack, "us"), 30, "the us router sees its new edge")
    for prompt, worker in ((before, holder), (during, holder_during)):
        headers = complete(stack, "us", prompt)
        assert (headers["x-kvc-worker"], headers["x-kvc-index"]) == (worker, "live")
    assert stack.exited() == []


def test_broker_gone_and_back_requests_are_answered_and_the_index_converges(
    stack: LocalStack,
) -> None:
    assert stack.infra is not None
    before = _prompt(4_096, seed=5)
    holder = complete(stack, "us", before)["x-kvc-worker"]
    wait_indexed(stack, "us", before, holder)
    stack.infra.kill("kafka")
    # Every edge marks its views not ready within seconds; the routers keep answering
    # from the last loaded views, and say so.
    poll_until(lambda: not views_live(stack, "us"), 20, "the us router sees the outage")
    headers = complete(stack, "us", before)
    assert (headers["x-kvc-worker"], headers["x-kvc-index"]) == (holder, "stale")
    assert metric(stack, "us", "kvc_router_index_live") == 0
    _, body = readyz(stack, "us")
    assert "last loaded" in body["conditions"]["views"]["detail"], body
    # A prefix admitted while the broker is away: its event waits in the worker.
    during = _prompt(4_096, seed=6)
    holder_during = complete(stack, "us", during)["x-kvc-worker"]
    stack.infra.restart("kafka")  # empty, with the topics created again

    # The MU and the edges recover in place, or exit (status 3) when they found the
    # broker back without their log, and their supervisor (here: this loop) restarts
    # them. The worker hosts never stop serving for it.
    def recovered() -> bool:
        for name in stack.exited():
            assert name in ("mu", "edge-us", "edge-eu", "edge-asia"), f"{name} exited"
            stack.restart(name)
        return all(views_live(stack, r) for r in ("us", "eu", "asia"))

    poll_until(recovered, 90, "every edge live again")
    # The event of the outage was delivered once the broker was back.
    wait_indexed(stack, "us", during, holder_during)
    after = _prompt(4_096, seed=7)
    holder_after = complete(stack, "us", after)["x-kvc-worker"]
    wait_indexed(stack, "us", after, holder_after)
    headers = complete(stack, "us", after)
    assert headers["x-kvc-worker"] == holder_after
    # Live: the edges follow the new patch log in place; they do not keep reloading
    # shards from newer snapshots (which a request could meet reloading: "stale").
    assert headers["x-kvc-index"] == "live"
    assert stack.exited() == []


def test_events_the_broker_acknowledged_then_lost_are_sent_again_by_their_workers(
    stack: LocalStack,
) -> None:
    assert stack.infra is not None
    # No MU reads the log, so a change the broker acknowledges now exists only there.
    stack.kill("mu")
    acked = "kvc_worker_event_batches_acked_total"
    before = stack.metric("workers-us", acked) or 0.0
    lost = _prompt(4_096, seed=8)
    headers = complete(stack, "us", lost)
    holder = headers["x-kvc-worker"]
    assert headers["x-kvc-region"] == "us"
    poll_until(
        lambda: (stack.metric("workers-us", acked) or 0.0) > before,
        20,
        "the broker acknowledging the holder's events",
        interval=0.05,
    )
    # The memory broker restarts empty: the acknowledged events are gone with its log.
    stack.infra.kill("kafka")
    stack.infra.restart("kafka")
    stack.restart("mu")

    def recovered() -> bool:
        for name in stack.exited():
            assert name.startswith("edge-"), f"{name} exited"
            stack.restart(name)
        return all(views_live(stack, r) for r in ("us", "eu", "asia"))

    poll_until(recovered, 90, "every edge live again")
    # Only the worker hosts know: their deliveries went to offsets they had already
    # seen acknowledged, so each sent its whole cache again as a new incarnation.
    wait_indexed(stack, "us", lost, holder)
    assert (stack.metric("workers-us", "kvc_worker_reannouncements_total") or 0.0) >= 1
    assert stack.exited() == []
