"""Ctrl-C that is never lost, for the commands that drive a run (``kvcompass demo``,
``kvcompass loadgen``).

Python's default SIGINT handler raises ``KeyboardInterrupt`` in whatever the main
thread is running. When that is a finalizer the garbage collector called (a closed
connection's ``__del__``, say), Python prints "Exception ignored" and drops the
exception: the interrupt is gone and the run goes on to its end. :class:`CtrlC`
records every Ctrl-C before raising, so a stage boundary can still see it
(:meth:`CtrlC.check`), and inside :meth:`CtrlC.run` it raises nothing at all: it
cancels the running task, which cannot be swallowed that way.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any, TypeVar

__all__ = ["CtrlC", "sigterm_as_ctrl_c"]

T = TypeVar("T")

_Handler = Any  # what signal.signal returns: a callable, an int, or None


class CtrlC:
    """Owns SIGINT while entered (``with CtrlC() as ctrl_c``) and restores the previous
    handler on exit."""

    def __init__(self) -> None:
        self.requested = False
        self._task: asyncio.Task[Any] | None = None
        self._previous: _Handler = None

    def __enter__(self) -> CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed, even if the exception it
        raised then was swallowed."""
        if self.requested:
            raise KeyboardInterrupt

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result, run in a new event loop; Ctrl-C cancels it and this raises
        ``KeyboardInterrupt`` once it has unwound."""
        with asyncio.Runner() as runner:
            loop = runner.get_loop()
            task = loop.create_task(coro)
            self._task = task
            try:
                self.check()  # pressed before the task was registered
                return loop.run_until_complete(task)
            except asyncio.CancelledError:
                if self.requested:
                    raise KeyboardInterrupt from None
                raise
            finally:
                self._task = None
                if not task.done():  # interrupted before its first step
                    task.cancel()
                    loop.run_until_complete(asyncio.gather(task, return_exceptions=True))

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        task = self._task
        if task is None:
            raise KeyboardInterrupt  # interrupts a blocking wait; check() covers a loss
        if not task.done():
            task.cancel()
            task.get_loop().call_soon_threadsafe(lambda: None)  # wake a waiting select()


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` while entered, so a batch command stopped by
    its supervisor (``kill``, a container's stop) cleans up as after Ctrl-C: a grid's
    worker processes are terminated rather than left to finish their cells."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
