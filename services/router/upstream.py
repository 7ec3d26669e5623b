"""The upstream side: one aiohttp session to every worker, with bounded timeouts.

aiohttp was chosen over httpx by measurement (README: about a quarter of the proxy
overhead and ten times the requests/s under concurrency on this machine). A failure
that another worker may not share (no endpoint, refused or reset connection, timeout,
a 5xx) raises :class:`UpstreamFailed`; a worker's 4xx is the client's problem and is
passed through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

__all__ = ["Reply", "Upstream", "UpstreamFailed"]


class UpstreamFailed(Exception):
    """A forward that failed for reasons of the worker, not of the request."""

    def __init__(self, worker_id: str, reason: str, *, reachable: bool) -> None:
        super().__init__(f"{worker_id}: {reason}")
        self.reachable = reachable  # it answered (badly): 502; else 503


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str


class Upstream:
    def __init__(
        self,
        urls: dict[int, str],
        ids: dict[int, str],
        *,
        connect_timeout_s: float,
        request_timeout_s: float,
        stream_idle_timeout_s: float,
    ) -> None:
        self._urls = urls
        self._ids = ids
        self._whole = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
        self._stream = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=stream_idle_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No cap on connections: the workers' queues, not the router, hold back work.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def has(self, worker: int) -> bool:
        return worker in self._urls

    def _url(self, worker: int, path: str) -> str:
        if worker not in self._urls:
            raise UpstreamFailed(self._ids[worker], "no endpoint configured", reachable=False)
        return self._urls[worker] + path

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    async def post(self, worker: int, path: str, body: bytes) -> Reply:
        """The whole response of a non-streaming POST."""
        url = self._url(worker, path)
        try:
            async with self.session.post(
                url, data=body, headers=_JSON, timeout=self._whole
            ) as resp:
                data = await resp.read()
                reply = Reply(resp.status, data, resp.content_type)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failed(worker, exc) from None
        if reply.status >= 500:
            raise UpstreamFailed(
                self._ids[worker], f"answered {reply.status}: {_snippet(data)}", reachable=True
            )
        return reply

    async def open_stream(self, worker: int, path: str, body: bytes) -> aiohttp.ClientResponse:
        """A streaming POST whose status is known and below 500 (the caller releases it)."""
        url = self._url(worker, path)
        try:
            resp = await self.session.post(url, data=body, headers=_JSON, timeout=self._stream)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failed(worker, exc) from None
        if resp.status >= 500:
            data = await resp.read()
            resp.release()
            raise UpstreamFailed(
                self._ids[worker], f"answered {resp.status}: {_snippet(data)}", reachable=True
            )
        return resp

    def _failed(self, worker: int, exc: BaseException) -> UpstreamFailed:
        if isinstance(exc, asyncio.TimeoutError):
            return UpstreamFailed(self._ids[worker], "timed out", reachable=False)
        reachable = isinstance(exc, aiohttp.ClientResponseError)
        return UpstreamFailed(
            self._ids[worker], f"{type(exc).__name__}: {exc}", reachable=reachable
        )


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Each SSE event of ``resp`` as its raw bytes (ending in the blank line), as soon as
    it is complete."""
    event = bytearray()
    async for line in resp.content:
        event += line
        if line in (b"\n", b"\r\n"):
            yield bytes(event)
            event.clear()
    if event.strip():
        yield bytes(event)


_JSON = {"content-type": "application/json"}


def _snippet(data: bytes, limit: int = 200) -> str:
    return data[:limit].decode(errors="replace")
