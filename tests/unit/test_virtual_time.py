"""The simulator's virtual time: events run in (time, scheduling) order, each with the
clock at its time; a run stops when told or at a deadline; nothing is kept after."""

from __future__ import annotations

import gc
import math
import random
import weakref
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.virtual_time import EventQueue, VirtualClock


@given(st.lists(st.integers(0, 20), max_size=200))
@settings(max_examples=200, deadline=None)
def test_events_run_by_time_then_in_the_order_they_were_scheduled(times: list[int]) -> None:
    queue, clock = EventQueue(), VirtualClock()
    ran: list[tuple[float, int, float]] = []

    def handler(at: float) -> Callable[[int], None]:
        return lambda i: ran.append((at, i, clock.monotonic()))

    for i, t in enumerate(times):
        queue.push(t / 4, handler(t / 4), i)
    assert len(queue) == len(times)
    queue.run(clock)
    assert [(t, i) for t, i, _ in ran] == sorted((t / 4, i) for i, t in enumerate(times))
    assert all(t == seen for t, _, seen in ran)  # the clock read each event's own time
    assert len(queue) == 0


def test_an_event_may_schedule_more_and_stop_the_run() -> None:
    queue, clock = EventQueue(), VirtualClock()
    ran: list[str] = []

    def first(_: object) -> None:
        ran.append("first")
        queue.push(clock.monotonic(), ran.append, "same time, after first")
        queue.push(2.0, stop)

    def stop(_: object) -> None:
        ran.append("stop")
        queue.stop()

    queue.push(1.0, first)
    queue.push(3.0, ran.append, "after the stop")
    queue.run(clock)
    assert ran == ["first", "same time, after first", "stop"]
    assert (len(queue), queue.next_time(), clock.monotonic()) == (1, 3.0, 2.0)
    queue.run(clock, until=2.5)  # nothing is due by then
    assert len(queue) == 1
    queue.run(clock, until=3.0)  # due at the deadline: it runs
    assert ran[-1] == "after the stop"
    assert queue.next_time() is None


def test_pop_takes_the_first_event_and_an_empty_queue_says_so() -> None:
    queue = EventQueue()
    queue.push(2.0, print, "b")
    queue.push(1.0, repr, "a")
    assert queue.pop() == (1.0, repr, "a")
    assert queue.pop() == (2.0, print, "b")
    with pytest.raises(IndexError, match="empty"):
        queue.pop()


def test_a_nan_time_is_refused_and_the_clock_never_goes_back() -> None:
    queue, clock = EventQueue(), VirtualClock(5.0)
    with pytest.raises(ValueError, match="NaN"):
        queue.push(math.nan, print)
    assert len(queue) == 0
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(4.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(math.nan)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1.0)
    assert clock.monotonic() == 5.0


def test_wall_time_is_the_virtual_time_in_rounded_nanoseconds() -> None:
    rng = random.Random(3)
    clock = VirtualClock()
    for _ in range(10_000):
        t = clock.monotonic() + rng.choice([0.0, 2.5e-9, 1e-3 * rng.random(), rng.random()])
        clock.set(t)
        assert clock.wall_ns() == round(t * 1e9)
    stepped = VirtualClock(wall_ns=7)
    stepped.advance(1.5e-9)  # round half to even, as round() does
    assert (stepped.monotonic(), stepped.wall_ns()) == (1.5e-9, 7 + round(1.5))


def test_a_run_keeps_no_handler_or_argument() -> None:
    """Events hold references the collector sees; once run, the queue holds none."""

    class Payload:
        pass

    queue, clock = EventQueue(), VirtualClock()
    payload = Payload()
    gone = weakref.ref(payload)
    queue.push(1.0, lambda p: None, payload)
    del payload
    assert gone() is not None
    queue.run(clock)
    assert gone() is None
    # A cycle through a pending event is collected with the queue.
    holder = Payload()
    holder.queue = EventQueue()  # type: ignore[attr-defined]
    holder.queue.push(1.0, lambda _: None, holder)  # type: ignore[attr-defined]
    held = weakref.ref(holder)
    del holder
    gc.collect()
    assert held() is None
