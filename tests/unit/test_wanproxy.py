"""The WAN proxy on loopback: added delay, uncapped throughput, close and reset
propagation, many connections, the endpoint map and its settings."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from kvcompass.loadgen.testing import poll_until
from kvcompass.services.wanproxy import (
    Link,
    WanProxy,
    WanProxySettings,
    parse_targets,
    plan_links,
    worker_endpoints_setting,
)
from kvcompass.settings import SettingsError
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")  # us-eu 160 ms, us-asia 126 ms one way
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads to EOF, then answers the byte count (needs the client's half-close)."""
    total = 0
    while data := await reader.read(1 << 20):
        total += len(data)
    writer.write(struct.pack("!Q", total))
    await writer.drain()
    writer.close()


@asynccontextmanager
async def _proxied(
    handler: Handler, one_way_ms: float, jitter_pct: float = 0.0
) -> AsyncIterator[tuple[int, WanProxy]]:
    """A server behind one link of ``one_way_ms``; yields the proxy port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = Link("us", "eu-0", ("127.0.0.1", port), one_way_ms)
    proxy = WanProxy(TOPOLOGY, {"eu-0": ("127.0.0.1", port)}, [link], jitter_pct=jitter_pct)
    async with proxy:
        url = proxy.endpoints["us"]["eu-0"]
        yield int(url.rsplit(":", 1)[1]), proxy
    server.close()
    await server.wait_closed()


async def _round_trip_ms(port: int, payload: bytes = b"x" * 100) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        writer.write(payload)
        assert await reader.readexactly(len(payload)) == payload
        times.append((time.perf_counter() - start) * 1000)
    writer.close()
    return times


def test_round_trip_pays_the_one_way_delay_twice() -> None:
    async def run() -> list[float]:
        async with _proxied(_echo, 20.0) as (port, _):
            return await asyncio.wait_for(_round_trip_ms(port), 10)

    times = asyncio.run(run())
    assert min(times) >= 40.0  # never faster than two one-way delays
    assert sorted(times)[len(times) // 2] < 40.0 + 30.0  # generous for a busy machine


def test_jitter_varies_the_delay_within_its_band_and_keeps_bytes_in_order() -> None:
    async def run() -> tuple[list[float], bytes]:
        async with _proxied(_echo, 20.0, jitter_pct=50.0) as (port, _):
            times = await asyncio.wait_for(_round_trip_ms(port), 10)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            blob = bytes(range(256)) * 4096  # 1 MiB: many chunks, each with its own delay
            writer.write(blob)
            echoed = await asyncio.wait_for(reader.readexactly(len(blob)), 10)
            writer.close()
            return times, echoed

    times, echoed = asyncio.run(run())
    assert echoed == bytes(range(256)) * 4096
    assert min(times) >= 20.0  # each way at least 10 ms (20 ms - 50 %)
    assert len({round(t) for t in times}) > 1  # not one fixed delay


def test_throughput_is_not_capped_by_the_delay() -> None:
    size = 50 * 1024 * 1024

    async def run() -> tuple[int, float]:
        async with _proxied(_count, 20.0) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.perf_counter()
            block = b"\0" * (1 << 20)
            for _ in range(size // len(block)):
                writer.write(block)
                await writer.drain()
            writer.write_eof()
            total = struct.unpack("!Q", await asyncio.wait_for(reader.readexactly(8), 30))[0]
            elapsed = time.perf_counter() - start
            writer.close()
            return total, elapsed

    total, elapsed = asyncio.run(run())
    assert total == size
    # A proxy that waited out each chunk's delay before reading the next would need
    # 800 chunks x 20 ms = 16 s; the delay adds 40 ms, the copies the rest.
    assert elapsed < 2.0, f"50 MB took {elapsed:.2f} s"


def test_half_close_reaches_the_server_and_its_answer_still_returns() -> None:
    async def run() -> tuple[bytes, float, bytes]:
        async with _proxied(_count, 20.0) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"abc")
            start = time.perf_counter()
            writer.write_eof()  # the server answers only after it has seen our FIN
            answer = await asyncio.wait_for(reader.readexactly(8), 10)
            elapsed = (time.perf_counter() - start) * 1000
            rest = await asyncio.wait_for(reader.read(), 10)  # then its FIN reaches us
            writer.close()
            return answer, elapsed, rest

    answer, elapsed_ms, rest = asyncio.run(run())
    assert struct.unpack("!Q", answer)[0] == 3
    assert elapsed_ms >= 40.0
    assert rest == b""


def test_server_reset_reaches_the_client_as_a_reset() -> None:
    async def resetter(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def run() -> tuple[type[BaseException] | None, float]:
        async with _proxied(resetter, 20.0) as (port, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.perf_counter()
            writer.write(b"x")
            error: type[BaseException] | None = None
            try:
                await asyncio.wait_for(reader.read(), 10)
            except ConnectionResetError as exc:
                error = type(exc)
            elapsed = (time.perf_counter() - start) * 1000
            writer.close()
            await asyncio.wait_for(_until(lambda: proxy.open_connections == 0), 10)
            return error, elapsed

    error, elapsed_ms = asyncio.run(run())
    assert error is ConnectionResetError
    assert elapsed_ms >= 40.0  # the reset travels the link like data


def test_unreachable_worker_is_a_reset_after_a_round_trip() -> None:
    async def run() -> tuple[type[BaseException] | None, float]:
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            dead = sock.getsockname()[1]
        link = Link("us", "eu-0", ("127.0.0.1", dead), 20.0)
        async with WanProxy(TOPOLOGY, {"eu-0": ("127.0.0.1", dead)}, [link]) as proxy:
            port = int(proxy.endpoints["us"]["eu-0"].rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.perf_counter()
            error: type[BaseException] | None = None
            try:
                await asyncio.wait_for(reader.read(), 10)
            except ConnectionResetError as exc:
                error = type(exc)
            writer.close()
            return error, (time.perf_counter() - start) * 1000

    error, elapsed_ms = asyncio.run(run())
    assert error is ConnectionResetError
    assert elapsed_ms >= 40.0


def test_many_concurrent_connections_each_get_their_own_bytes() -> None:
    async def one(port: int, i: int) -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = f"connection {i} ".encode() * 100
        writer.write(payload)
        writer.write_eof()
        echoed = await reader.read()
        writer.close()
        return echoed == payload

    async def run() -> tuple[int, float, int]:
        async with _proxied(_echo, 20.0) as (port, proxy):
            start = time.perf_counter()
            results = await asyncio.wait_for(
                asyncio.gather(*(one(port, i) for i in range(200))), 30
            )
            elapsed = time.perf_counter() - start
            await asyncio.wait_for(_until(lambda: proxy.open_connections == 0), 10)
            return sum(results), elapsed, proxy.open_connections

    ok, elapsed, still_open = asyncio.run(run())
    assert ok == 200
    assert still_open == 0  # every relay ended once both sides closed
    assert elapsed < 10.0  # in parallel: not 200 round trips one after another


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_links_and_endpoint_map() -> None:
    targets = {w.id: ("127.0.0.1", 9100 + w.index) for w in TOPOLOGY.workers}
    links = plan_links(TOPOLOGY, targets, port_base=0)
    # Each origin gets a link to every worker of the other regions: 14 - own region.
    assert len(links) == (14 - 8) + (14 - 2) + (14 - 4)
    us_eu = next(link for link in links if link.origin == "us" and link.worker == "eu-0")
    assert us_eu.one_way_ms == 160.0
    assert not any(TOPOLOGY.worker(link.worker).region == link.origin for link in links)
    numbered = plan_links(TOPOLOGY, targets, origins=("eu",), port_base=20000)
    assert [link.port for link in numbered] == list(range(20000, 20012))
    with pytest.raises(KeyError, match="unknown worker"):
        plan_links(TOPOLOGY, {"mars-0": ("127.0.0.1", 1)})

    async def run() -> dict[str, dict[str, str]]:
        async with WanProxy(TOPOLOGY, targets, links) as proxy:
            return proxy.endpoints

    endpoints = asyncio.run(run())
    assert set(endpoints) == {"us", "eu", "asia"}
    assert endpoints["us"]["us-3"] == "http://127.0.0.1:9103"  # own region: direct
    assert endpoints["us"]["eu-0"] != "http://127.0.0.1:9108"  # remote: through a link
    assert len(set(endpoints["eu"].values())) == 14
    setting = worker_endpoints_setting(endpoints["us"])
    assert setting.startswith("us-0=http://127.0.0.1:9100,us-1=")


def test_targets_parse_inline_and_files(tmp_path: Path) -> None:
    assert parse_targets("us-0=127.0.0.1:9100, eu-0=http://localhost:9300/") == {
        "us-0": ("127.0.0.1", 9100),
        "eu-0": ("localhost", 9300),
    }
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"asia-1": "127.0.0.1:9401"}))
    assert parse_targets(str(path)) == {"asia-1": ("127.0.0.1", 9401)}
    for bad in ("us-0", "us-0=127.0.0.1", "us-0=h:1,us-0=h:2", "us-0=h:99999"):
        with pytest.raises(ValueError):  # noqa: PT011 - the messages differ per case
            parse_targets(bad)
    with pytest.raises(SettingsError, match="KVC_WANPROXY_TARGETS"):
        WanProxySettings(targets="us-0=nowhere")
    with pytest.raises(SettingsError, match="KVC_WANPROXY_JITTER_PCT"):
        WanProxySettings(jitter_pct=150.0)


def test_service_writes_the_map_relays_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``kvcompass wanproxy`` as a process: map file, a delayed echo, SIGTERM → exit 0."""
    echo = socket.create_server(("127.0.0.1", 0))
    port = echo.getsockname()[1]
    map_file = tmp_path / "map.json"
    env = dict(
        os.environ,
        KVC_WANPROXY_TARGETS=f"eu-0=127.0.0.1:{port}",
        KVC_WANPROXY_ORIGINS="us",
        KVC_WANPROXY_MAP_FILE=str(map_file),
        KVC_TIME_SCALE="0.125",  # us-eu 160 ms → 20 ms
    )
    with (
        open(tmp_path / "wanproxy.log", "wb") as log,
        subprocess.Popen(
            [sys.executable, "-m", "kvcompass.services.wanproxy"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
        ) as proc,
    ):
        _drive_service(proc, map_file, echo)


def _drive_service(proc: subprocess.Popen[bytes], map_file: Path, echo: socket.socket) -> None:
    try:
        endpoints = poll_until(
            lambda: map_file.exists() and json.loads(map_file.read_text()), 30, "map file"
        )
        host, proxy_port = endpoints["us"]["eu-0"].removeprefix("http://").split(":")
        client = socket.create_connection((host, int(proxy_port)), timeout=10)
        server, _ = echo.accept()
        start = time.perf_counter()
        client.sendall(b"ping")
        assert server.recv(4) == b"ping"
        server.sendall(b"pong")
        assert client.recv(4) == b"pong"
        assert (time.perf_counter() - start) * 1000 >= 40.0
        client.close()
        server.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == endpoints
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        echo.close()
