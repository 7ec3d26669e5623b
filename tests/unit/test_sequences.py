"""Per-worker duplicate filter: redeliveries dropped, jumps refused, restarts explicit."""

from __future__ import annotations

import pytest

from kvcompass.errors import BadInput
from kvcompass.pipeline.sequences import (
    RETIRED_KEPT,
    Admission,
    SequenceRefused,
    WorkerSequences,
)

JUMP = 1000


def _seen(table: WorkerSequences, *batches: tuple[str, int, int]) -> list[Admission]:
    """Admit and record each (worker, incarnation, seq), as a writer does."""
    out = []
    for worker, incarnation, seq in batches:
        admission = table.admit(worker, incarnation, seq)
        if admission is not Admission.DUPLICATE:
            table.record(worker, incarnation, seq)
        out.append(admission)
    return out


def test_a_worker_s_batches_apply_once_and_redeliveries_are_dropped() -> None:
    table = WorkerSequences(JUMP)
    got = _seen(table, ("w", 7, 0), ("w", 7, 1), ("w", 7, 5), ("w", 7, 5), ("w", 7, 3))
    assert got == [Admission.APPLY] * 3 + [Admission.DUPLICATE] * 2
    assert table.current("w") == (7, 5)


def test_admit_changes_nothing() -> None:
    table = WorkerSequences(JUMP)
    assert table.admit("w", 7, 0) is Admission.APPLY
    assert table.admit("w", 7, 0) is Admission.APPLY  # not recorded: not a duplicate yet
    assert table.current("w") is None


@pytest.mark.parametrize(("last", "seq"), [(-1, JUMP), (4, 4 + JUMP + 1), (4, 2**63 - 1)])
def test_a_jump_beyond_the_window_is_refused_naming_the_numbers(last: int, seq: int) -> None:
    table = WorkerSequences(JUMP)
    if last >= 0:
        _seen(table, ("w", 7, last))
    with pytest.raises(SequenceRefused, match=rf"worker 'w' incarnation 7 seq {seq} jumps"):
        table.admit("w", 7, seq)
    assert table.current("w") == (None if last < 0 else (7, last))
    # The worker's later, ordinary batches still apply.
    assert _seen(table, ("w", 7, last + 1)) == [Admission.APPLY]


def test_the_window_edge_applies() -> None:
    table = WorkerSequences(JUMP)
    assert _seen(table, ("w", 7, JUMP - 1), ("w", 7, 2 * JUMP - 1)) == [Admission.APPLY] * 2


def test_a_refused_batch_is_bad_input() -> None:
    assert issubclass(SequenceRefused, BadInput)


def test_a_new_incarnation_restarts_the_numbering_and_retires_the_old_one() -> None:
    table = WorkerSequences(JUMP)
    got = _seen(
        table,
        ("w", 7, 0),
        ("w", 7, 9),
        ("w", 8, 0),  # restart
        ("w", 7, 9),  # redelivery of the old run: dropped
        ("w", 7, 3),
        ("w", 8, 0),
        ("w", 8, 1),
    )
    assert got == [
        Admission.APPLY,
        Admission.APPLY,
        Admission.RESTART,
        Admission.DUPLICATE,
        Admission.DUPLICATE,
        Admission.DUPLICATE,
        Admission.APPLY,
    ]
    assert table.current("w") == (8, 1)


def test_a_retired_incarnation_cannot_continue() -> None:
    table = WorkerSequences(JUMP)
    _seen(table, ("w", 7, 4), ("w", 8, 0))
    superseded = r"incarnation 7 seq 5: .* superseded by 8 after seq 4"
    with pytest.raises(SequenceRefused, match=superseded):
        table.admit("w", 7, 5)


def test_a_run_may_jump_by_at_most_the_limit() -> None:
    table = WorkerSequences(JUMP)
    _seen(table, ("w", 7, 4))
    assert table.admit("w", 7, 4 + JUMP) is Admission.APPLY
    with pytest.raises(SequenceRefused, match="jumps more than 1000 past seq 4"):
        table.admit("w", 7, 5 + JUMP)


def test_a_new_incarnation_far_from_zero_is_refused() -> None:
    table = WorkerSequences(JUMP)
    _seen(table, ("w", 7, 4))
    with pytest.raises(SequenceRefused, match="jumps more than 1000 past its start"):
        table.admit("w", 9, JUMP)


def test_only_the_most_recent_incarnations_are_remembered() -> None:
    table = WorkerSequences(JUMP)
    runs = list(range(100, 100 + RETIRED_KEPT + 2))
    _seen(table, *((("w", run, 3)) for run in runs))
    assert table.current("w") == (runs[-1], 3)
    for run in runs[1:-1]:
        assert table.admit("w", run, 3) is Admission.DUPLICATE
    # The oldest was forgotten: it would be a restart now (bounded memory).
    assert table.admit("w", runs[0], 3) is Admission.RESTART


def test_workers_are_independent() -> None:
    table = WorkerSequences(JUMP)
    assert _seen(table, ("a", 1, 5), ("b", 1, 0), ("a", 1, 5)) == [
        Admission.APPLY,
        Admission.APPLY,
        Admission.DUPLICATE,
    ]
    assert len(table) == 2


def test_the_table_round_trips_through_its_map_and_decides_the_same() -> None:
    table = WorkerSequences(JUMP)
    _seen(table, ("us@0", 7, 4), ("us@0", 8, 2), ("us@0", 9, 1), ("eu-1", 3, 11))
    entries = table.to_map()
    assert entries == {
        "eu-1@0@3": 11,
        "us@0@0@9": 1,
        "us@0@1@8": 2,
        "us@0@2@7": 4,
    }
    back = WorkerSequences.from_map(entries, JUMP)
    assert back.to_map() == entries
    for probe in [("us@0", 7, 4), ("us@0", 7, 5), ("us@0", 8, 2), ("us@0", 9, 2), ("eu-1", 3, 11)]:
        try:
            want: object = table.admit(*probe)
        except SequenceRefused as exc:
            want = str(exc)
        try:
            got: object = back.admit(*probe)
        except SequenceRefused as exc:
            got = str(exc)
        assert got == want, probe


@pytest.mark.parametrize(
    "entries",
    [{"w": 3}, {"w@x@1": 3}, {"w@1@5": 3}, {"w@0@5": -1}, {f"w@{r}@{r}": 1 for r in range(6)}],
)
def test_a_map_it_cannot_have_written_is_refused(entries: dict[str, int]) -> None:
    with pytest.raises(BadInput):
        WorkerSequences.from_map(entries, JUMP)
