"""Shared-memory views: a reader in another process sees exactly the writer's state."""

from __future__ import annotations

import multiprocessing as mp
import random
import uuid

import pytest

from kvcompass.index import LudoTable
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


def test_reader_refuses_foreign_segment(prefix: str) -> None:
    with pytest.raises(FileNotFoundError):
        SharedIndexReader(prefix)
