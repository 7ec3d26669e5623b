"""Fault injection as a wrapper around any message source (tests and the simulator).

A :class:`FaultySource` wraps a poll function (``Callable[[], Sequence[T]]``, e.g. a Kafka
consume call or an in-memory queue) and drops, duplicates, reorders and delays the
messages it returns, drawing every decision from one seeded RNG so a failing run can be
replayed. Delays count polls, not seconds: no clock, the same under a virtual clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

from kvcompass.errors import BadInput

__all__ = ["FaultCounts", "Faults", "FaultySource"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Faults:
    """Per-message fault probabilities, each in [0, 1)."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # delivered after the message behind it
    delay: float = 0.0  # held back for 1..max_delay_polls polls
    max_delay_polls: int = 3

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder", "delay"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise BadInput(f"fault probability {name}={value!r} is not in [0, 1)")
        if self.max_delay_polls < 1:
            raise BadInput(f"max_delay_polls={self.max_delay_polls!r} must be ≥ 1")


@dataclass(slots=True)
class FaultCounts:
    """How many messages each fault hit so far."""

    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0

    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


class FaultySource(Generic[T]):
    """``source`` with faults: call it like the poll function it wraps."""

    def __init__(self, source: Callable[[], Sequence[T]], faults: Faults, *, seed: int) -> None:
        self._source = source
        self.faults = faults
        self.counts = FaultCounts()
        self._rng = random.Random(seed)
        self._swapped: list[T] = []  # at most one, waiting for the next message to pass it
        self._polls = 0
        self._delayed: list[tuple[int, T]] = []  # (poll that releases it, message)

    def __call__(self) -> list[T]:
        return self.disturb(self._source())

    @classmethod
    def iterate(cls, messages: Iterable[T], faults: Faults, *, seed: int) -> Iterator[T]:
        """An iterable with faults: each message is one poll, held ones come at the end."""
        faulty: FaultySource[T] = cls(lambda: (), faults, seed=seed)
        for message in messages:
            yield from faulty.disturb((message,))
        yield from faulty.flush()

    def disturb(self, messages: Sequence[T]) -> list[T]:
        """One poll's ``messages`` after the faults (a held message may come later)."""
        f, rng, out = self.faults, self._rng, []
        self._polls += 1
        for message in messages:
            if rng.random() < f.drop:
                self.counts.dropped += 1
                continue
            if not self._swapped and rng.random() < f.reorder:
                self.counts.reordered += 1
                self._swapped.append(message)
                continue
            if rng.random() < f.delay:
                self.counts.delayed += 1
                self._delayed.append((self._polls + rng.randint(1, f.max_delay_polls), message))
                continue
            out.append(message)
            if rng.random() < f.duplicate:
                self.counts.duplicated += 1
                out.append(message)
            out.extend(self._take_swapped())
        if not messages:
            out.extend(self._take_swapped())  # an idle stream has nothing to pass it
        due = [m for poll, m in self._delayed if poll <= self._polls]
        self._delayed = [(poll, m) for poll, m in self._delayed if poll > self._polls]
        return out + due

    def flush(self) -> list[T]:
        """Every message still held back (the end of a finite stream)."""
        held = self._take_swapped() + [m for _, m in self._delayed]
        self._delayed = []
        return held

    def _take_swapped(self) -> list[T]:
        swapped, self._swapped = self._swapped, []
        return swapped
