"""One proxied TCP connection: each direction delays every chunk by the link's one-way
time, in order, without waiting for earlier chunks to be delivered first (a queue of
(deadline, chunk)), so the delay adds latency but caps no throughput.

Ends travel like data: a FIN (EOF) is half-closed on the other side once its deadline
passes, and a reset (RST) is passed on as a reset. The TCP handshake itself is not
delayed: a new connection costs one round trip less than over a real WAN (routers keep
their connections alive, so requests do not pay it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from enum import Enum

__all__ = ["CHUNK_BYTES", "relay", "reset"]

CHUNK_BYTES = 65_536


class _End(Enum):
    EOF = "eof"
    RESET = "reset"


_Item = tuple[float, bytes | _End]


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN (SO_LINGER 0), so the peer sees a reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def relay(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    delay_s: Callable[[], float],
    buffer_chunks: int,
) -> None:
    """Relay between two connected streams until both directions ended."""
    forward = asyncio.create_task(_direction(a[0], b[1], delay_s, buffer_chunks))
    backward = asyncio.create_task(_direction(b[0], a[1], delay_s, buffer_chunks))
    try:
        await asyncio.gather(forward, backward)
    finally:
        forward.cancel()
        backward.cancel()
        for writer in (a[1], b[1]):
            if not writer.is_closing():  # a reset one is closed already
                writer.close()


async def _direction(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: Callable[[], float],
    buffer_chunks: int,
) -> _End:
    queue: asyncio.Queue[_Item] = asyncio.Queue(buffer_chunks)
    loop = asyncio.get_running_loop()

    async def read() -> None:
        last = 0.0
        while True:
            try:
                chunk: bytes | _End = await reader.read(CHUNK_BYTES) or _End.EOF
            except OSError:  # reset by the peer (or a dead socket): pass a reset on
                chunk = _End.RESET
            # Jitter never reorders: a chunk leaves no earlier than the one before it.
            last = max(last, loop.time() + delay_s())
            await queue.put((last, chunk))
            if isinstance(chunk, _End):
                return

    reading = asyncio.create_task(read())
    try:
        while True:
            deadline, chunk = await queue.get()
            wait = deadline - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if chunk is _End.RESET:
                reset(writer)
                return _End.RESET
            try:
                if chunk is _End.EOF:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return _End.EOF
                assert isinstance(chunk, bytes)
                writer.write(chunk)
                await writer.drain()
            except OSError:  # the receiver is gone; its own direction reports how
                return _End.EOF
    finally:
        reading.cancel()
