"""Bucket seed search: the smallest seed separating a bucket's keys, scalar and vectorised."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvcompass.index.errors import TableFull
from kvcompass.index.geometry import TableGeometry
from kvcompass.index.seeds import MAX_SEED, find_seed, find_seeds_array

G = TableGeometry.for_capacity(1000, fingerprint_bits=8, rng=random.Random(42))


def brute_force_seed(g: TableGeometry, keys: list[int]) -> int | None:
    """The smallest seed in 0..255 under which ``geometry.slot`` separates ``keys``."""
    for seed in range(MAX_SEED + 1):
        if len({g.slot(k, seed) for k in keys}) == len(keys):
            return seed
    return None


def random_buckets(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    edge = [0, 2**63 - 1]
    buckets = []
    for _ in range(n):
        size = rng.randint(1, 4)
        keys: set[int] = set()
        while len(keys) < size:
            keys.add(rng.choice(edge) if rng.random() < 0.05 else rng.getrandbits(63))
        buckets.append(sorted(keys, key=lambda _: rng.random()))
    return buckets


def test_find_seed_is_smallest_separating_seed() -> None:
    sizes = {1: 0, 2: 0, 3: 0, 4: 0}
    for keys in random_buckets(1, 1500):
        seed, cells = find_seed(G, keys)
        assert seed == brute_force_seed(G, keys), keys
        assert cells == [G.slot(k, seed) for k in keys]
        assert len(set(cells)) == len(keys)
        assert all(0 <= c < 4 for c in cells)
        sizes[len(keys)] += 1
    assert min(sizes.values()) > 300  # every bucket size was exercised


def test_find_seed_reaches_later_slot_words() -> None:
    # Seeds of 32 and more live in the second and later hash words; make sure such
    # buckets occur and are still answered with the smallest seed.
    big = 0
    for keys in random_buckets(2, 4000):
        if len(keys) == 4:
            seed, _ = find_seed(G, keys)
            assert seed == brute_force_seed(G, keys)
            big += seed >= 32
    assert big > 0


def test_find_seed_trivial_buckets() -> None:
    assert find_seed(G, []) == (0, [])
    for key in (0, 1, 2**63 - 1):
        seed, cells = find_seed(G, [key])
        assert seed == 0
        assert cells == [G.slot(key, 0)]


def test_find_seed_depends_on_geometry_slot_seed() -> None:
    other = TableGeometry.for_capacity(1000, fingerprint_bits=8, rng=random.Random(43))
    buckets = random_buckets(3, 200)
    ours = [find_seed(G, keys)[0] for keys in buckets]
    theirs = [find_seed(other, keys)[0] for keys in buckets]
    assert ours != theirs
    assert theirs == [brute_force_seed(other, keys) for keys in buckets]


def test_find_seed_raises_when_no_seed_separates() -> None:
    # The same key twice never lands in two different cells.
    with pytest.raises(TableFull, match="no bucket seed separates 2 keys"):
        find_seed(G, [7, 7])
    with pytest.raises(TableFull):
        find_seeds_array(
            G,
            np.array([[5, 5, 0, 0], [1, 2, 3, 4]], dtype=np.uint64),
            np.array([[True, True, False, False], [True] * 4]),
        )


def as_rows(buckets: list[list[int]], rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """(n, 4) key and occupancy arrays, each bucket's keys at random positions."""
    keys = np.zeros((len(buckets), 4), dtype=np.uint64)
    occupied = np.zeros((len(buckets), 4), dtype=bool)
    for row, bucket in enumerate(buckets):
        where = rng.sample(range(4), len(bucket))
        for pos, key in zip(where, bucket, strict=True):
            keys[row, pos] = key
            occupied[row, pos] = True
        # Junk in empty positions must not influence the answer.
        for pos in set(range(4)) - set(where):
            keys[row, pos] = rng.choice([0, bucket[0], rng.getrandbits(63)])
    return keys, occupied


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_find_seeds_array_agrees_with_find_seed(seed: int) -> None:
    rng = random.Random(seed)
    buckets = random_buckets(seed, 2000)
    keys, occupied = as_rows(buckets, rng)
    seeds, cells = find_seeds_array(G, keys, occupied)
    assert seeds.dtype == np.uint8
    assert seeds.shape == (len(buckets),)
    assert cells.shape == keys.shape
    for row in range(len(buckets)):
        positions = np.flatnonzero(occupied[row]).tolist()
        row_keys = [int(keys[row, p]) for p in positions]
        want_seed, want_cells = find_seed(G, row_keys)
        assert int(seeds[row]) == want_seed
        assert [int(cells[row, p]) for p in positions] == want_cells


def test_find_seeds_array_empty_rows_and_no_rows() -> None:
    keys = np.array([[9, 9, 9, 9], [1, 2, 3, 4]], dtype=np.uint64)
    occupied = np.array([[False] * 4, [True] * 4])
    seeds, _ = find_seeds_array(G, keys, occupied)
    assert int(seeds[0]) == 0
    assert int(seeds[1]) == find_seed(G, [1, 2, 3, 4])[0]
    seeds, cells = find_seeds_array(
        G, np.zeros((0, 4), dtype=np.uint64), np.zeros((0, 4), dtype=bool)
    )
    assert seeds.shape == (0,)
    assert cells.shape == (0, 4)
