"""Serving a :class:`RouterApp` with uvicorn (uvloop, httptools) on a socket that
several router processes may share (SO_REUSEPORT: the kernel spreads connections)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator

import uvicorn

__all__ = ["QuietServer", "reuse_port_socket", "serve"]


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves the signals to the process shell (kvcompass.services
    .runtime) and stops when told (``should_exit``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def reuse_port_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    # Accepted sockets inherit it: uvicorn writes a response's head and body separately,
    # and with Nagle on a keep-alive client's delayed ACK could add 40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def config(app: object) -> uvicorn.Config:
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        loop="none",  # the caller's loop (uvloop, see serve)
        http="httptools",
        lifespan="on",
        access_log=False,
        log_config=None,  # structlog owns the logs
        timeout_graceful_shutdown=5,
    )


def serve(
    app: object,
    sock: socket.socket,
    stop: threading.Event,
    *,
    started: Callable[[], Awaitable[None]],
    stopping: Callable[[], Awaitable[None]],
) -> None:
    """Run ``app`` on ``sock`` under uvloop until ``stop`` is set; ``started`` runs on the
    loop before serving, ``stopping`` after the server has drained.

    The loop runs in a thread of its own: an event loop in the main thread installs its
    own signal wakeup fd, which would hide SIGTERM from the process shell's watcher."""
    import uvloop

    server = QuietServer(config(app))

    async def main() -> None:
        await started()
        loop = asyncio.get_running_loop()
        watcher = loop.run_in_executor(None, stop.wait)
        watcher.add_done_callback(lambda _: setattr(server, "should_exit", True))
        try:
            await server.serve(sockets=[sock])
        finally:
            stop.set()  # the server may also end on its own (a failed start)
            await watcher
            await stopping()

    failure: list[BaseException] = []

    def run() -> None:
        try:
            uvloop.run(main())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="router-loop")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
