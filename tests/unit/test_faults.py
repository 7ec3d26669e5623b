"""Fault injection around a message source: seeded, accounted for, nothing lost by mistake."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcompass.errors import BadInput
from kvcompass.pipeline import Faults, FaultySource


class Queue:
    """A poll function over a list: up to ``per_poll`` messages a call."""

    def __init__(self, messages: Sequence[int], per_poll: int = 5) -> None:
        self.messages = list(messages)
        self.per_poll = per_poll

    def __call__(self) -> list[int]:
        out, self.messages = self.messages[: self.per_poll], self.messages[self.per_poll :]
        return out


def drain(source: FaultySource[int], idle_polls: int = 10) -> list[int]:
    """Poll until the source has been empty ``idle_polls`` times in a row."""
    out: list[int] = []
    idle = 0
    while idle < idle_polls:
        got = source()
        out.extend(got)
        idle = 0 if got else idle + 1
    return out


def test_without_faults_the_source_passes_through() -> None:
    source = FaultySource(Queue(range(100)), Faults(), seed=1)
    assert drain(source) == list(range(100))
    assert source.counts.total() == 0


def test_the_same_seed_disturbs_the_same_way() -> None:
    faults = Faults(drop=0.1, duplicate=0.1, reorder=0.1, delay=0.1)

    def run(seed: int) -> list[int]:
        return drain(FaultySource(Queue(range(300)), faults, seed=seed))

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_drops_keep_order_and_are_counted() -> None:
    source = FaultySource(Queue(range(2000)), Faults(drop=0.1), seed=3)
    out = drain(source)
    assert out == sorted(out)
    assert len(set(out)) == len(out)
    assert len(out) + source.counts.dropped == 2000
    assert 100 < source.counts.dropped < 300


def test_duplicates_come_right_after_the_original() -> None:
    source = FaultySource(Queue(range(2000)), Faults(duplicate=0.2), seed=4)
    out = drain(source)
    assert sorted(set(out)) == list(range(2000))
    twice = [m for m, n in Counter(out).items() if n == 2]
    assert len(twice) == source.counts.duplicated > 200
    assert max(Counter(out).values()) == 2
    assert out == sorted(out)  # each copy is adjacent to its original


def test_a_reordered_message_comes_right_after_the_one_behind_it() -> None:
    source = FaultySource(Queue(range(2000), per_poll=7), Faults(reorder=0.1), seed=5)
    out = drain(source)
    assert sorted(out) == list(range(2000))  # nothing lost, nothing doubled
    swaps = [i for i in range(len(out) - 1) if out[i] > out[i + 1]]
    assert len(swaps) == source.counts.reordered > 100
    assert all(out[i] == out[i + 1] + 1 for i in swaps)


def test_a_delayed_message_comes_within_the_maximum_number_of_polls() -> None:
    faults = Faults(delay=0.2, max_delay_polls=3)
    queue = Queue(range(1000), per_poll=4)
    source = FaultySource(queue, faults, seed=6)
    polls: dict[int, int] = {}
    n = 0
    while len(polls) < 1000:
        n += 1
        for message in source():
            polls[message] = n
    assert source.counts.delayed > 100
    late = [m for m in polls if polls[m] > m // 4 + 1]
    assert len(late) == source.counts.delayed
    assert all(polls[m] <= m // 4 + 1 + 3 for m in late)


def test_a_held_message_is_released_when_the_stream_goes_idle() -> None:
    source = FaultySource(Queue([1]), Faults(reorder=0.999), seed=0)
    assert source() == []  # held back, waiting for a message to pass it
    assert source() == [1]  # none came


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 200),
    drop=st.sampled_from([0.0, 0.3]),
    duplicate=st.sampled_from([0.0, 0.3]),
    reorder=st.sampled_from([0.0, 0.3]),
    delay=st.sampled_from([0.0, 0.3]),
)
def test_every_message_is_delivered_or_accounted_for(
    seed: int, n: int, drop: float, duplicate: float, reorder: float, delay: float
) -> None:
    faults = Faults(drop=drop, duplicate=duplicate, reorder=reorder, delay=delay)
    out = list(FaultySource.iterate(range(n), faults, seed=seed))
    counts = Counter(out)
    assert not set(counts) - set(range(n))
    if drop == 0.0:
        assert set(counts) == set(range(n))  # held messages come out at the end
    source = FaultySource(Queue(range(n)), faults, seed=seed)
    delivered = drain(source)
    assert len(delivered) == n - source.counts.dropped + source.counts.duplicated


def test_iterate_wraps_any_iterable_of_any_type() -> None:
    words = [f"m{i}" for i in range(50)]
    out = list(FaultySource.iterate(iter(words), Faults(delay=0.5, reorder=0.3), seed=2))
    assert sorted(out) == sorted(words)
    assert out != words


@pytest.mark.parametrize(
    "faults",
    [
        {"drop": 1.0},
        {"duplicate": -0.1},
        {"reorder": 2.0},
        {"delay": 1.5},
        {"max_delay_polls": 0},
    ],
)
def test_impossible_fault_settings_are_refused(faults: dict[str, float]) -> None:
    with pytest.raises(BadInput):
        Faults(**faults)  # type: ignore[arg-type]
