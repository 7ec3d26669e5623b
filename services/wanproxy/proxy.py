"""The WAN proxy: one listener per (origin region, remote worker), each relaying to the
worker with the topology's one-way latency between the two regions added each way.

An edge router of region ``o`` reaches its own region's workers directly and every other
worker through the listener of link ``(o, worker)``; :attr:`WanProxy.endpoints` is that
map, origin → worker id → URL, ready for the router's ``KVC_WORKER_ENDPOINTS``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from kvcompass.services.wanproxy.relay import relay, reset
from kvcompass.topology import Topology

__all__ = ["Link", "WanProxy", "plan_links", "worker_endpoints_setting"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Link:
    """Requests from ``origin`` to ``worker`` (in another region) at ``target``."""

    origin: str
    worker: str
    target: tuple[str, int]
    one_way_ms: float
    port: int = 0  # the listener's port; 0 = OS-chosen


def plan_links(
    topology: Topology,
    targets: Mapping[str, tuple[str, int]],
    origins: tuple[str, ...] = (),
    port_base: int = 0,
) -> list[Link]:
    """Links from each origin to every targeted worker of another region, in topology
    order (origin, then worker); ports ``port_base + i`` unless ``port_base`` is 0."""
    for worker in targets:
        topology.worker(worker)  # KeyError names an unknown worker
    names = origins or tuple(r.name for r in topology.regions)
    links: list[Link] = []
    for origin in names:
        topology.region(origin)
        for w in topology.workers:
            if w.id in targets and w.region != origin:
                port = port_base + len(links) if port_base else 0
                links.append(
                    Link(origin, w.id, targets[w.id], topology.wan_ms(origin, w.region), port)
                )
    return links


def worker_endpoints_setting(endpoints: Mapping[str, str]) -> str:
    """One origin's map as a ``KVC_WORKER_ENDPOINTS`` value: ``us-0=http://...,...``."""
    return ",".join(f"{worker}={url}" for worker, url in endpoints.items())


class WanProxy:
    """The listeners of every link, in one event loop. ``async with`` starts and stops."""

    def __init__(
        self,
        topology: Topology,
        targets: Mapping[str, tuple[str, int]],
        links: list[Link],
        *,
        listen_host: str = "127.0.0.1",
        jitter_pct: float = 0.0,
        time_scale: float = 1.0,
        buffer_chunks: int = 1024,
        seed: int | None = None,
    ) -> None:
        self.topology = topology
        self.targets = dict(targets)
        self.links = links
        self.listen_host = listen_host
        self.jitter = jitter_pct / 100.0
        self.time_scale = time_scale
        self.buffer_chunks = buffer_chunks
        self._rng = random.Random(seed)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self.endpoints: dict[str, dict[str, str]] = {}

    async def __aenter__(self) -> WanProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> dict[str, dict[str, str]]:
        """Bind every listener; returns (and keeps) the endpoint map."""
        bound: dict[tuple[str, str], str] = {}
        try:
            for link in self.links:
                server = await asyncio.start_server(
                    self._handler(link), self.listen_host, link.port, reuse_address=True
                )
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                bound[(link.origin, link.worker)] = f"http://{self.listen_host}:{port}"
        except BaseException:
            await self.close()
            raise
        for origin in dict.fromkeys(link.origin for link in self.links):
            self.endpoints[origin] = {
                w.id: bound.get((origin, w.id)) or "http://{}:{}".format(*self.targets[w.id])
                for w in self.topology.workers
                if w.id in self.targets
            }
        return self.endpoints

    async def close(self) -> None:
        """Stop listening and cut every open connection."""
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def delay_s(self, link: Link) -> Callable[[], float]:
        base = link.one_way_ms * self.time_scale / 1000.0
        if not self.jitter:
            return lambda: base
        rng, jitter = self._rng, self.jitter
        return lambda: base * (1.0 + rng.uniform(-jitter, jitter))

    def _handler(self, link: Link) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
        delay_s = self.delay_s(link)

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.create_task(self._serve(link, delay_s, reader, writer))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

        return accept

    async def _serve(
        self,
        link: Link,
        delay_s: Callable[[], float],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        try:
            try:
                upstream = await asyncio.open_connection(*link.target)
            except OSError as exc:
                # The worker is down: the client learns it as a reset, one round trip on.
                log.info(
                    "upstream_unreachable", origin=link.origin, worker=link.worker, error=str(exc)
                )
                await asyncio.sleep(2 * delay_s())
                reset(writer)
                return
            await relay((reader, writer), upstream, delay_s, self.buffer_chunks)
        except asyncio.CancelledError:
            reset(writer)
            raise
