"""How the router's HTTP stack was chosen: proxy overhead of Starlette vs FastAPI (both on
uvicorn with uvloop and httptools) with httpx vs aiohttp as the upstream client.

Usage: pip install fastapi httpx; python bench/router_stack.py [--requests N]

Each candidate is a minimal proxy (read the body, parse it, POST it upstream, return
the answer) in its own process in front of one upstream process (Starlette answering a
fixed body). Prints one JSON object: per candidate the P50 / P99 latency and its excess
over calling the upstream directly (one sequential keep-alive client; direct calls
measured again beside each candidate), and requests/s under 32 concurrent clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from typing import Any

import aiohttp
import httpx

BODY = json.dumps({"model": "m", "prompt": list(range(64)), "max_tokens": 1}).encode()

UPSTREAM = r"""
import json, sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
ANSWER = json.dumps({"id": "x", "object": "text_completion",
                     "choices": [{"text": "a", "index": 0}]}).encode()
async def complete(request):
    await request.body()
    return Response(ANSWER, media_type="application/json")
app = Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
"""

PROXY = r"""
import json, sys, uvicorn
from starlette.responses import Response
framework, client, port, upstream = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
state = {}
async def forward(body):
    if "c" not in state:
        if client == "httpx":
            import httpx
            state["c"] = httpx.AsyncClient(limits=httpx.Limits(max_connections=64))
        else:
            import aiohttp
            state["c"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
    c = state["c"]
    headers = {"content-type": "application/json"}
    if client == "httpx":
        r = await c.post(upstream, content=body, headers=headers)
        return r.status_code, r.content
    async with c.post(upstream, data=body, headers=headers) as r:
        return r.status, await r.read()
async def complete(request):
    body = await request.body()
    json.loads(body)
    status, data = await forward(body)
    return Response(data, status_code=status, media_type="application/json")
if framework == "starlette":
    from starlette.applications import Starlette
    from starlette.routing import Route
    app = Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])
else:
    from fastapi import FastAPI, Request
    app = FastAPI()
    @app.post("/v1/completions")
    async def fastapi_complete(request: Request):
        return await complete(request)
uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.post(url, content=BODY)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


def _latencies(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client() as client:
        for _ in range(50):
            client.post(url, content=BODY)
        for _ in range(n):
            t = time.perf_counter()
            assert client.post(url, content=BODY).status_code == 200
            out.append((time.perf_counter() - t) * 1e3)
    return sorted(out)


async def _rate(url: str, concurrency: int, seconds: float) -> float:
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < end:
                async with s.post(url, data=BODY) as r:
                    await r.read()
                    done += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def _q(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    args = parser.parse_args()
    up_port = _free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1/completions"
    procs = [subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)])]
    results: dict[str, Any] = {}
    try:
        _wait(upstream)
        for framework in ("starlette", "fastapi"):
            for client in ("httpx", "aiohttp"):
                port = _free_port()
                proc = subprocess.Popen(
                    [sys.executable, "-c", PROXY, framework, client, str(port), upstream]
                )
                procs.append(proc)
                url = f"http://127.0.0.1:{port}/v1/completions"
                _wait(url)
                direct = _latencies(upstream, args.requests)
                routed = _latencies(url, args.requests)
                results[f"{framework}+{client}"] = {
                    "p50_ms": round(_q(routed, 0.5), 3),
                    "p99_ms": round(_q(routed, 0.99), 3),
                    "overhead_p50_ms": round(_q(routed, 0.5) - _q(direct, 0.5), 3),
                    "overhead_p99_ms": round(_q(routed, 0.99) - _q(direct, 0.99), 3),
                    "requests_per_s": round(asyncio.run(_rate(url, 32, 4.0)), 1),
                }
                proc.terminate()
                proc.wait()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
