"""Ctrl-C is never lost: not when Python drops the ``KeyboardInterrupt`` it raised
inside a finalizer, not while an event loop runs (the demo's flaky exit, stop 13)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvcompass.loadgen.ctrl_c import CtrlC


class _PressesCtrlCWhenCollected:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs here, inside the finalizer


@pytest.fixture(autouse=True)
def _default_sigint() -> Iterator[None]:
    """Python's own handler, whatever the runner left (a background job ignores SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _collect_one_finalizer(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Run a finalizer that presses Ctrl-C; return what Python dropped meanwhile."""
    dropped: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    obj = _PressesCtrlCWhenCollected()
    del obj
    return dropped


def test_the_default_handler_loses_a_ctrl_c_raised_in_a_finalizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why CtrlC exists: this is the loss it guards against."""
    dropped = _collect_one_finalizer(monkeypatch)
    assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]


def test_a_ctrl_c_dropped_in_a_finalizer_is_still_seen_at_the_next_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with CtrlC() as ctrl_c:
        _collect_one_finalizer(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_run_cancels_the_task_and_raises_even_from_a_finalizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unwound = []

    async def long_run() -> None:
        try:
            _collect_one_finalizer(monkeypatch)
            await asyncio.sleep(30)
        finally:
            unwound.append(True)

    started = time.monotonic()
    with CtrlC() as ctrl_c, pytest.raises(KeyboardInterrupt):
        ctrl_c.run(long_run())
    assert unwound == [True]
    assert time.monotonic() - started < 5


def test_run_returns_the_result_when_nobody_presses_ctrl_c() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    with CtrlC() as ctrl_c:
        assert ctrl_c.run(answer()) == 42
        ctrl_c.check()


def _press_ctrl_c_and_wait() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)


def test_ctrl_c_outside_run_raises_at_once() -> None:
    started = time.monotonic()
    with CtrlC(), pytest.raises(KeyboardInterrupt):
        _press_ctrl_c_and_wait()
    assert time.monotonic() - started < 4
