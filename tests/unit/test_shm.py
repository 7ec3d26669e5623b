"""Shared-memory views: a reader in another process sees exactly the writer's state."""

from __future__ import annotations

import multiprocessing as mp
import random
import time
import uuid
from typing import Any

import pytest

from kvcompass.index import LudoTable, SnapshotError
from kvcompass.shm import SharedIndexReader, SharedIndexWriter


@pytest.fixture
def prefix() -> str:
    return f"kvct{uuid.uuid4().hex[:10]}"


def _reader_answers(prefix: str, keys: list[int], out: mp.Queue) -> None:  # type: ignore[type-arg]
    reader = SharedIndexReader(prefix)
    try:
        out.put([reader.lookup(0, 0, k) for k in keys])
    finally:
        reader.close()


def _answers_in_child(prefix: str, keys: list[int]) -> list[int]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_reader_answers, args=(prefix, keys, out))
    proc.start()
    try:
        answers: list[int] = out.get(timeout=60)
    finally:
        proc.join(timeout=60)
    assert proc.exitcode == 0
    return answers


def test_reader_follows_patches_growth_and_othello_resets(prefix: str) -> None:
    rng = random.Random(5)
    table = LudoTable.with_capacity(64, rng=rng)
    writer = SharedIndexWriter(prefix, n_shards=1, n_tables=1)
    try:
        writer.load_table(0, 0, table.view_image())
        reference: dict[int, int] = {}
        generations = {table.geometry.generation}
        resets = 0
        for step in range(600):
            key = rng.getrandbits(63)
            reference[key] = step % 7 + 1
            patch = table.put(key, reference[key])
            if patch.reload is not None:
                writer.load_table(0, 0, patch.reload)
            else:
                resets += patch.othello_reset is not None
                writer.apply(0, {0: patch})
            generations.add(table.geometry.generation)
        writer.set_position(0, seq=600, epoch=1)
        assert len(generations) > 1, "the table should have grown at least once"
        assert resets > 0, "at least one Othello rebuild should have happened"
        keys = list(reference)
        assert _answers_in_child(prefix, keys) == [reference[k] for k in keys]
        reader = SharedIndexReader(prefix)
        try:
            assert reader.ready()
            assert reader.position(0) == (600, 1, True)
            assert [reader.lookup(0, 0, k) for k in keys] == [reference[k] for k in keys]
        finally:
            reader.close()
    finally:
        writer.close()


def test_reader_refuses_missing_half_made_and_foreign_segments(prefix: str) -> None:
    with pytest.raises(FileNotFoundError):
        SharedIndexReader(prefix)
    writer = SharedIndexWriter(prefix, 1, 1)
    try:
        header = writer._ctl.buf  # the control segment's first bytes: the header
        saved = bytes(header[:16])
        # Zeroed: a writer between creating the segment and writing its header.
        header[:16] = bytes(16)
        with pytest.raises(FileNotFoundError, match="being initialised"):
            SharedIndexReader(prefix)
        header[:8] = b"NOTKVCMP"
        with pytest.raises(SnapshotError, match="not a KVCompass control segment"):
            SharedIndexReader(prefix)
        header[:16] = saved
        SharedIndexReader(prefix).close()
    finally:
        writer.close()


def _read_stable_keys(
    prefix: str,
    expected: dict[int, int],
    started: Any,
    done: Any,
    out: Any,
) -> None:
    reader = SharedIndexReader(prefix)
    wrong = reads = 0
    try:
        started.set()
        while not done.is_set() or reads == 0:
            for key, value in expected.items():
                reads += 1
                if reader.lookup(0, 0, key) != value:
                    wrong += 1
        out.put((reads, wrong))
    finally:
        reader.close()


def test_concurrent_reader_never_sees_a_torn_state(prefix: str) -> None:
    """A reader in another process keeps reading stable keys right while churn moves
    them between buckets, re-seeds their buckets, flips Othello bits and grows the
    table. (Races are rare in CPython, so this guards against regressions rather than
    proving the sequence lock necessary.)"""
    rng = random.Random(9)
    table = LudoTable.with_capacity(2000, fingerprint_bits=8, rng=rng)
    stable = {rng.getrandbits(63): rng.randrange(1, 1 << 32) for _ in range(1500)}
    writer = SharedIndexWriter(prefix, n_shards=1, n_tables=1)
    try:
        writer.load_table(0, 0, table.view_image())
        writer.apply(0, {0: table.put_many(list(stable), list(stable.values()))})
        ctx = mp.get_context("spawn")
        started, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_read_stable_keys, args=(prefix, stable, started, done, out))
        proc.start()
        try:
            deadline = time.monotonic() + 120
            while not started.wait(0.05):
                assert proc.is_alive(), f"reader exited early with {proc.exitcode}"
                assert time.monotonic() < deadline, "reader did not start"
            churn: list[int] = []
            generations = {table.geometry.generation}
            for step in range(3000):
                if churn and step % 3 == 2:
                    patch = table.remove(churn.pop(rng.randrange(len(churn))))
                else:
                    churn.append(rng.getrandbits(63))
                    patch = table.put(churn[-1], 7)
                if patch.reload is not None:
                    writer.load_table(0, 0, patch.reload)
                else:
                    writer.apply(0, {0: patch})
                generations.add(table.geometry.generation)
            done.set()
            reads, wrong = out.get(timeout=60)
        finally:
            done.set()
            proc.join(timeout=60)
        assert proc.exitcode == 0
        assert len(generations) > 1, "the churn should have grown the table"
        assert reads > len(stable)
        assert wrong == 0
    finally:
        writer.close()
