"""Scalar and vectorised hashes agree bit for bit; table geometry validation and sizing."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from kvcompass.hashing import MASK63, MASK64, mix64, mix64_array
from kvcompass.index.geometry import DEFAULT_LOAD_LIMIT, TableGeometry

EDGE_KEYS = [0, 1, 2, 3, 31, 32, 63, 64, 2**32 - 1, 2**32, 2**62, 2**63 - 2, 2**63 - 1]


def random_keys(seed: int, n: int = 2000) -> list[int]:
    rng = random.Random(seed)
    return EDGE_KEYS + [rng.getrandbits(63) for _ in range(n)]


def as_array(keys: list[int]) -> np.ndarray:
    return np.array(keys, dtype=np.uint64)


def geometry(nb: int, *, fingerprint_bits: int = 8, seed: int = 0, **kw: int) -> TableGeometry:
    """A valid geometry with ``nb`` buckets and random hash seeds."""
    rng = random.Random(seed)
    capacity = kw.pop("capacity", math.floor(4 * nb * DEFAULT_LOAD_LIMIT))
    mb = kw.pop("mb", max(capacity, 1))
    return TableGeometry(
        nb=nb,
        ma=kw.pop("ma", math.ceil(mb * 4 / 3)),
        mb=mb,
        capacity=capacity,
        value_bits=kw.pop("value_bits", 32),
        fingerprint_bits=fingerprint_bits,
        generation=kw.pop("generation", 0),
        bucket_seed=rng.getrandbits(64),
        othello_seed=rng.getrandbits(64),
        slot_seed=rng.getrandbits(64),
        fingerprint_seed=rng.getrandbits(64),
    )


# Small, odd, power-of-two and the largest sizes the geometry accepts.
GEOMETRIES = [
    geometry(1, seed=1),
    geometry(5, seed=2, fingerprint_bits=0),
    geometry(64, seed=3, fingerprint_bits=1),
    geometry(1000, seed=4, fingerprint_bits=16),
    geometry(12_345, seed=5, value_bits=64, fingerprint_bits=7),
    geometry(2**20 + 7, seed=6),
    geometry(2**31 - 1, seed=7, capacity=2**29, mb=2**29, ma=2**30),
]
GEOMETRY_IDS = [f"nb{g.nb}-fp{g.fingerprint_bits}" for g in GEOMETRIES]


# -- mix64 ------------------------------------------------------------------------------


def test_mix64_known_answers() -> None:
    assert mix64(0) == 0  # fmix64 fixes zero
    # Pinned: every hash position of every key derives from this, snapshots included.
    assert mix64(1) == 0xB456BCFC34C2CB2C
    assert mix64(MASK64) == 0x64B5720B4B825F21


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mix64_array_matches_scalar(seed: int) -> None:
    rng = random.Random(seed)
    xs = EDGE_KEYS + [MASK64, MASK64 - 1, 2**63] + [rng.getrandbits(64) for _ in range(3000)]
    arr = as_array(xs)
    expected = [mix64(x) for x in xs]
    assert mix64_array(arr).tolist() == expected
    assert arr.tolist() == xs  # input untouched without ``out``


def test_mix64_array_out_parameter() -> None:
    xs = random_keys(9, 500)
    expected = [mix64(x) for x in xs]
    src = as_array(xs)
    out = np.empty_like(src)
    assert mix64_array(src, out=out) is out
    assert out.tolist() == expected
    assert src.tolist() == xs
    inplace = as_array(xs)
    assert mix64_array(inplace, out=inplace) is inplace
    assert inplace.tolist() == expected


def test_mix64_is_a_bijection_on_a_sample() -> None:
    xs = list(range(4096)) + [MASK64 - i for i in range(4096)]
    assert len({mix64(x) for x in xs}) == len(xs)


# -- geometry hash positions ---------------------------------------------------------


@pytest.mark.parametrize("g", GEOMETRIES, ids=GEOMETRY_IDS)
def test_buckets_scalar_and_array_agree(g: TableGeometry) -> None:
    keys = random_keys(g.nb)
    b0, b1 = g.buckets_array(as_array(keys))
    scalar = [g.buckets(k) for k in keys]
    assert list(zip(b0.tolist(), b1.tolist(), strict=True)) == scalar
    assert all(0 <= a < g.nb and 0 <= b < g.nb for a, b in scalar)


@pytest.mark.parametrize("g", GEOMETRIES, ids=GEOMETRY_IDS)
def test_nodes_scalar_and_array_agree(g: TableGeometry) -> None:
    keys = random_keys(g.nb + 1)
    ia, ib = g.nodes_array(as_array(keys))
    scalar = [g.nodes(k) for k in keys]
    assert list(zip(ia.tolist(), ib.tolist(), strict=True)) == scalar
    assert all(0 <= a < g.ma <= b < g.n_nodes for a, b in scalar)


@pytest.mark.parametrize("g", GEOMETRIES, ids=GEOMETRY_IDS)
def test_slots_scalar_and_array_agree_for_every_seed(g: TableGeometry) -> None:
    keys = random_keys(g.nb + 2, 300)
    arr = as_array(keys)
    for seed in range(256):
        seeds = np.full(len(keys), seed, dtype=np.uint8)
        got = g.slots_array(arr, seeds).tolist()
        assert got == [g.slot(k, seed) for k in keys], f"seed {seed}"
    # Mixed seeds in one call, aligned with the keys.
    rng = random.Random(g.nb)
    mixed = [rng.randrange(256) for _ in keys]
    got = g.slots_array(arr, np.array(mixed, dtype=np.uint8)).tolist()
    assert got == [g.slot(k, s) for k, s in zip(keys, mixed, strict=True)]
    assert arr.tolist() == keys  # input untouched


@pytest.mark.parametrize("g", GEOMETRIES, ids=GEOMETRY_IDS)
def test_slot_words_scalar_and_array_agree(g: TableGeometry) -> None:
    keys = random_keys(g.nb + 3, 200)
    for word in range(8):
        got = g.slot_words_array(as_array(keys), word).tolist()
        assert got == [g.slot_word(k, word) for k in keys]


def test_slot_reads_bit_pairs_of_slot_words() -> None:
    g = GEOMETRIES[3]
    for k in random_keys(11, 50):
        for seed in range(256):
            word = g.slot_word(k, seed // 32)
            assert g.slot(k, seed) == (word >> (2 * (seed % 32))) & 3


@pytest.mark.parametrize("bits", [0, 1, 7, 8, 9, 15, 16])
def test_fingerprints_scalar_and_array_agree(bits: int) -> None:
    g = replace(GEOMETRIES[3], fingerprint_bits=bits)
    keys = random_keys(bits)
    got = g.fingerprints_array(as_array(keys)).tolist()
    expected = [g.fingerprint(k) for k in keys]
    assert got == expected
    assert all(0 <= f < 2**bits for f in expected)
    if bits == 0:
        assert set(expected) == {0}
    else:  # fingerprints spread over their range
        assert len(set(expected)) > min(2**bits, len(keys)) // 2


def test_hashes_depend_on_their_own_seed_only() -> None:
    g = GEOMETRIES[3]
    keys = random_keys(12, 200)
    other = replace(g, othello_seed=g.othello_seed ^ 1)
    assert [g.buckets(k) for k in keys] == [other.buckets(k) for k in keys]
    assert [g.slot(k, 3) for k in keys] == [other.slot(k, 3) for k in keys]
    assert [g.nodes(k) for k in keys] != [other.nodes(k) for k in keys]
    assert g.with_othello_seed(other.othello_seed) == other


def test_keys_are_63_bit_digests() -> None:
    assert max(EDGE_KEYS) == MASK63


# -- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"value_bits": 16}, "value_bits must be 32 or 64"),
        ({"value_bits": 0}, "value_bits must be 32 or 64"),
        ({"fingerprint_bits": -1}, "fingerprint_bits must be in 0..16"),
        ({"fingerprint_bits": 17}, "fingerprint_bits must be in 0..16"),
        ({"nb": 0}, "bad table sizes"),
        ({"nb": 2**31}, "bad table sizes"),
        ({"ma": 0}, "bad table sizes"),
        ({"mb": 0}, "bad table sizes"),
        ({"capacity": -1}, "exceeds table or locator size"),
        ({"capacity": 4 * 10 + 1}, "exceeds table or locator size"),  # more keys than cells
        ({"mb": 30}, "exceeds table or locator size"),  # more keys than locator B cells
    ],
)
def test_geometry_validation(changes: dict[str, int], message: str) -> None:
    g = geometry(10, capacity=38, mb=40)
    replace(g, capacity=40)  # the bounds themselves are fine
    with pytest.raises(ValueError, match=message):
        replace(g, **changes)


def test_geometry_rejects_locators_the_vectorised_hash_cannot_address() -> None:
    # Node positions are computed as (32-bit hash · size) in uint64 and kept as int32
    # node ids; larger locators would make scalar and vectorised lookups disagree.
    g = geometry(2**31 - 1, capacity=2**29, mb=2**29, ma=2**30)
    with pytest.raises(ValueError, match="bad table sizes"):
        replace(g, ma=2**32 + 1)
    with pytest.raises(ValueError, match="bad table sizes"):
        replace(g, ma=2**31 - 2**29, mb=2**29)  # ma + mb == 2^31


@pytest.mark.parametrize("load_limit", [0.0, -0.5, 0.981, 1.0])
def test_for_capacity_rejects_bad_load_limits(load_limit: float) -> None:
    with pytest.raises(ValueError, match="load_limit"):
        TableGeometry.for_capacity(100, load_limit=load_limit)


@pytest.mark.parametrize("value_bits", [32, 64])
def test_for_capacity_sizes(value_bits: int) -> None:
    rng = random.Random(5)
    for requested in [*range(400), 1000, 4096, 10_007, 123_456, 10**6]:
        g = TableGeometry.for_capacity(requested, value_bits=value_bits, rng=rng)
        assert g.capacity >= max(requested, 8)
        assert g.capacity <= DEFAULT_LOAD_LIMIT * g.n_cells
        # Smallest: one bucket fewer would not hold the requested keys at 95%.
        assert (g.nb - 1) * 4 * DEFAULT_LOAD_LIMIT < max(requested, 8)
        assert g.mb == g.capacity
        assert g.ma == math.ceil(4 * g.mb / 3)
        assert abs(g.ma / g.mb - 4 / 3) < 0.2
        assert g.n_nodes == g.ma + g.mb
        assert g.n_words * 64 >= g.n_nodes > (g.n_words - 1) * 64
        assert g.value_bits == value_bits
        assert g.generation == 0
        assert g.workers_per_value == value_bits // 2
        assert g.value_mask == 2**value_bits - 1


def test_for_capacity_other_load_limits_and_seeds() -> None:
    g = TableGeometry.for_capacity(1000, load_limit=0.5, generation=3, rng=random.Random(1))
    assert g.capacity >= 1000
    assert g.capacity <= 0.5 * g.n_cells
    assert g.generation == 3
    same = TableGeometry.for_capacity(1000, load_limit=0.5, generation=3, rng=random.Random(1))
    assert same == g  # seeds come from the rng only
    other = TableGeometry.for_capacity(1000, load_limit=0.5, generation=3, rng=random.Random(2))
    assert other.bucket_seed != g.bucket_seed
    seeds = {g.bucket_seed, g.othello_seed, g.slot_seed, g.fingerprint_seed}
    assert len(seeds) == 4


def test_the_compiled_mix64_agrees_with_the_python_one() -> None:
    from kvcompass.hashing import mix64_compiled

    rng = random.Random(8)
    for x in [0, 1, MASK63, MASK64] + [rng.getrandbits(64) for _ in range(200)]:
        assert int(mix64_compiled(np.uint64(x))) == mix64(x)
