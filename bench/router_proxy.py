"""Benchmark of the edge router's proxy path: what it adds over calling a worker directly.

Usage: python bench/router_proxy.py [--quick] [--policy NAME] [--max-processes N]
       (or ``measure(...)`` from another benchmark)

Prints one JSON object:

- ``proxy_overhead_p50_ms`` / ``_p99_ms``: the router's P50 / P99 latency minus the
  worker's, for one client sending non-streaming completions (1,024 token ids, one
  output token) one at a time on keep-alive connections; direct and routed requests
  alternate so both see the same machine load.
- ``router_requests_per_s``: requests/s of one router process under ``--concurrency``
  concurrent clients (``direct_requests_per_s``: the stub alone, for scale);
  ``requests_per_s_by_processes`` the same for 1..N processes on one port
  (SO_REUSEPORT), and ``saturating_processes`` the first count after which another
  process adds less than 5 %.

The worker is the router's stub (``kvcompass.services.router.testing.StubWorker``,
answering at once) in a process of its own, so the numbers are the router's. The router
processes run the real app and policy (``--policy``, default "kvcompass") without an
edge: the index is not ready, so the policy scores every worker as if nothing matched
("no-index"); ``bench/routing.py`` measures decisions over a real index. The load
generator, the stub and the routers share this machine's cores (reported).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import httpx

MODEL = "llama-3.1-8b"
PROMPT = list(range(1024))
BODY = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 1}).encode()
DIRECT_BODY = json.dumps(
    {**json.loads(BODY), "kvc": {"claimed_tokens": 0, "origin_region": "us",
                                 "namespace": "default", "request_id": "bench"}}
).encode()  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the processes under test ------------------------------------------------------------


def serve_stub(port: int) -> None:
    from kvcompass.services.router.server import reuse_port_socket, serve
    from kvcompass.services.router.testing import StubWorker

    async def nothing() -> None:
        return None

    app = StubWorker("us-0", "us").app()
    serve(app, reuse_port_socket("127.0.0.1", port), threading.Event(),
          started=nothing, stopping=nothing)  # fmt: skip


def _router_main(port: int, upstream: str, policy: str) -> None:
    from prometheus_client import CollectorRegistry

    from kvcompass.index.layout import IndexLayout
    from kvcompass.pipeline.clock import SystemClock
    from kvcompass.routing import RoutingConfig, make_policy
    from kvcompass.services.health import Health
    from kvcompass.services.router.app import RouterApp
    from kvcompass.services.router.server import reuse_port_socket, serve
    from kvcompass.services.router.tenancy import Tenancy
    from kvcompass.services.router.tokenizer import ByteTokenizer
    from kvcompass.services.router.upstream import Upstream
    from kvcompass.services.router.views import EdgeViews
    from kvcompass.topology import load_builtin

    topology = load_builtin("testbed-3region")
    views = EdgeViews(f"bench-none-{os.getpid()}", IndexLayout.from_topology(topology), 30.0)
    # Every worker is the one stub: whichever the policy picks answers.
    urls = {w.index: upstream for w in topology.workers}
    router = RouterApp(
        topology=topology, region="us",
        policy=make_policy(policy, topology, "us", views, config=RoutingConfig(),
                           clock=SystemClock()),
        upstream=Upstream(urls, {w.index: w.id for w in topology.workers},
                          connect_timeout_s=1, request_timeout_s=10, stream_idle_timeout_s=10),
        tenancy=Tenancy(""), tokenizer=ByteTokenizer(), health=Health(),
        registry=CollectorRegistry(), index=views, max_body_bytes=8 << 20,
    )  # fmt: skip

    async def nothing() -> None:
        return None

    serve(router.app, reuse_port_socket("127.0.0.1", port), threading.Event(),
          started=nothing, stopping=nothing)  # fmt: skip


def _spawn(stack: ExitStack, *args: str) -> None:
    proc = subprocess.Popen([sys.executable, __file__, *args])
    stack.callback(proc.wait)
    stack.callback(proc.terminate)


def _wait_up(url: str, body: bytes) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.post(url, content=body, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def _wait_listening(port: int, n: int) -> None:
    """Until ``n`` sockets listen on ``port`` (/proc/net/tcp, state 0A)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        found = sum(
            1
            for line in lines
            if int(line.split()[1].split(":")[1], 16) == port and line.split()[3] == "0A"
        )
        if found >= n:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{n} processes did not listen on {port}")


# -- measurements ------------------------------------------------------------------------


def _q(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def latencies(direct: str, routed: str, n: int) -> dict[str, float]:
    d: list[float] = []
    r: list[float] = []
    with httpx.Client(timeout=10) as client:
        for _ in range(50):  # warm both paths and their connection pools
            client.post(direct, content=DIRECT_BODY)
            client.post(routed, content=BODY)
        for _ in range(n):
            for url, body, out in ((direct, DIRECT_BODY, d), (routed, BODY, r)):
                t = time.perf_counter()
                resp = client.post(url, content=body)
                out.append((time.perf_counter() - t) * 1e3)
                assert resp.status_code == 200, resp.text
    return {
        "direct_p50_ms": _q(d, 0.5),
        "direct_p99_ms": _q(d, 0.99),
        "routed_p50_ms": _q(r, 0.5),
        "routed_p99_ms": _q(r, 0.99),
        "proxy_overhead_p50_ms": _q(r, 0.5) - _q(d, 0.5),
        "proxy_overhead_p99_ms": _q(r, 0.99) - _q(d, 0.99),
    }


async def _rate(url: str, concurrency: int, seconds: float, body: bytes = BODY) -> float:
    done = 0
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < end:
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    done += resp.status == 200

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def measure(
    quick: bool = False, policy: str = "kvcompass", max_processes: int = 3, concurrency: int = 32
) -> dict[str, Any]:
    """The benchmark's JSON object (bench/routing.py can merge it into its own)."""
    n, seconds = (300, 2.0) if quick else (1500, 5.0)
    stub_port = _free_port()
    upstream = f"http://127.0.0.1:{stub_port}"
    rates: dict[int, float] = {}
    lat: dict[str, float] = {}
    with ExitStack() as stack:
        _spawn(stack, "--serve-stub", str(stub_port))
        _wait_up(upstream + "/v1/completions", DIRECT_BODY)
        port = _free_port()
        routed = f"http://127.0.0.1:{port}/v1/completions"
        direct_rate = asyncio.run(
            _rate(upstream + "/v1/completions", concurrency, seconds, DIRECT_BODY)
        )
        for k in range(1, max_processes + 1):
            _spawn(stack, "--serve-router", str(port), upstream, policy)
            _wait_listening(port, k)  # the new process serves too, not only the old ones
            _wait_up(routed, BODY)
            if k == 1:
                lat = latencies(upstream + "/v1/completions", routed, n)
            rates[k] = asyncio.run(_rate(routed, concurrency, seconds))
    saturating = next(
        (k for k in sorted(rates) if k + 1 in rates and rates[k + 1] < 1.05 * rates[k]),
        max(rates),
    )
    return {
        **{k: round(v, 3) for k, v in lat.items()},
        "router_requests_per_s": round(rates[1], 1),
        "direct_requests_per_s": round(direct_rate, 1),
        "requests_per_s_by_processes": {str(k): round(v, 1) for k, v in rates.items()},
        "saturating_processes": saturating,
        "policy": policy,
        "prompt_tokens": len(PROMPT),
        "requests_per_path": n,
        "concurrency": concurrency,
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter runs")
    parser.add_argument("--policy", default="kvcompass")
    parser.add_argument("--max-processes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    result = measure(args.quick, args.policy, args.max_processes, args.concurrency)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-stub"]:
        serve_stub(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--serve-router"]:
        _router_main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
