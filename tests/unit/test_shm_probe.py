"""The compiled match of both readers against the Python view and decoder, called from
Python (numba's dispatcher) and from C (the entry the readers use)."""

from __future__ import annotations

import random
import sys
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvcompass.index import LudoTable, LudoView, probe, probe_call
from kvcompass.index.image import ImageHeader, layout_of


def _table(value_bits: int, fp_bits: int, seed: int = 3) -> tuple[LudoTable, list[int]]:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 1 << 63, 3000, dtype=np.uint64))
    # Random 2-bit tier fields (never 3) in every slot of the value width.
    fields = rng.integers(0, 3, (len(keys), value_bits // 2), dtype=np.uint64)
    values = (fields << (2 * np.arange(value_bits // 2, dtype=np.uint64))).sum(axis=1)
    values[values == 0] = 1
    table = LudoTable.build(
        keys,
        values,
        capacity=4000,
        value_bits=value_bits,
        fingerprint_bits=fp_bits,
        rng=random.Random(seed),
    )
    return table, keys.tolist()


def _described(image: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A writable copy of ``image`` and its one-row descriptor table (the copy must
    outlive every kernel call: the descriptor holds its address)."""
    buf = np.frombuffer(bytearray(image), np.uint8)
    header = ImageHeader.unpack(image)
    desc = np.zeros((1, probe.N_COLUMNS), np.uint64)
    probe.describe(desc[0], buf.ctypes.data, header.geometry, layout_of(header.geometry))
    return buf, desc


@pytest.mark.parametrize("value_bits", [32, 64])
@pytest.mark.parametrize("fp_bits", [0, 5, 8, 16])
def test_compiled_lookup_equals_the_view_bit_for_bit(value_bits: int, fp_bits: int) -> None:
    """Inserted keys and never-inserted ones: with no (or few) fingerprint bits the
    false hits must be the view's false hits, which only an exact copy of every hash,
    seed and offset reproduces."""
    table, keys = _table(value_bits, fp_bits)
    image = table.view_image()
    view = LudoView(image)
    _buf, desc = _described(image)
    aliens = np.random.default_rng(9).integers(0, 1 << 63, 3000, dtype=np.uint64).tolist()
    d = desc[0]

    def lookup(key: np.uint64) -> int:  # the kernel's three stages for one key
        return int(probe._value(d, key, probe._cell(d, key, probe._bucket(d, key))))

    got = [lookup(np.uint64(k)) for k in keys + aliens]
    want = [view.lookup(k) for k in keys + aliens]
    assert got == want
    assert got[: len(keys)] == [table.get(k) for k in keys]
    if fp_bits <= 5:  # aliens do hit: the comparison above covered the false-hit path
        assert any(got[len(keys) :])


def _match_at(desc: Any, n_tables: int, keys: Any, probes: Any, workers: Any, *out: Any) -> None:
    """probe_call.match through a target checked first, the keys as an array("Q")."""
    target = probe_call.MatchTarget(desc, n_tables, workers, *out)
    probe_call.match_at(target, array("Q", keys.tolist()), probes)


#: The kernel as numba's dispatcher runs it, and from C with either key type, with the
#: arrays checked per call or once.
MATCHES: list[tuple[Callable[..., None], type[np.integer[Any]]]] = [
    (probe.match_probes, np.int64),
    (probe_call.match, np.int64),
    (probe_call.match, np.uint64),
    (_match_at, np.uint64),
]


@pytest.mark.parametrize(("match", "key_type"), MATCHES)
@pytest.mark.parametrize("chained", [False, True])
def test_match_probes_decodes_like_the_python_decoder(
    chained: bool, match: Callable[..., None], key_type: type[np.integer[Any]]
) -> None:
    """One 64-bit table whose 32 fields belong to scattered workers: each worker gets
    the length of its last probe with a nonzero field, and that field's tier. Rows whose
    key index is past the keys (a prompt shorter than their length) are skipped.
    Chained, a field counts only if its worker's match so far is the row's ``after``
    (the previous length): the keys' random values leave most chains broken early."""
    table, keys = _table(64, 16)
    _buf, desc = _described(table.view_image())
    owners = random.Random(4).sample(range(100), 32)
    workers = probe.table_workers([tuple(owners)])
    picked = keys[:40]
    after = [16 * i if chained else probe.UNCHECKED for i in range(len(picked) + 5)]
    probes = np.array([(i, 0, 16 * (i + 1), a) for i, a in enumerate(after)], np.int64)
    lengths, tiers = np.zeros(100, np.int64), np.zeros(100, np.int64)
    touched = np.zeros(1, np.uint8)
    match(desc, 1, np.array(picked, key_type), probes, workers, lengths, tiers, touched)
    want_lengths, want_tiers = [0] * 100, [0] * 100
    for i, key in enumerate(picked):
        value = table.get(key)
        for field in range(32):
            tier = (value >> (2 * field)) & 3
            w = owners[field]
            if tier and (not chained or want_lengths[w] == 16 * i):
                want_lengths[w] = 16 * (i + 1)
                want_tiers[w] = tier
    assert lengths.tolist() == want_lengths
    assert tiers.tolist() == want_tiers
    assert touched.tolist() == [1]
    assert any(want_lengths)
    if chained:  # the check bit: no chain runs through all 40 random values
        assert max(want_lengths) < 16 * len(picked)


def test_a_match_target_keeps_its_arrays_and_refuses_keys_and_probes_it_cannot_read() -> None:
    table, keys = _table(32, 16)
    _buf, desc = _described(table.view_image())
    probes = np.array([(0, 0, 16, probe.UNCHECKED), (1, 0, 32, 16)], np.int64)
    lengths, tiers = np.zeros(16, np.int64), np.zeros(16, np.int64)
    workers = probe.table_workers([tuple(range(16))])
    want_lengths, want_tiers = np.zeros(16, np.int64), np.zeros(16, np.int64)
    probe_call.match(
        desc, 1, np.array(keys[:2], np.uint64), probes, workers, want_lengths, want_tiers,
        np.zeros(1, np.uint8),
    )  # fmt: skip
    assert want_lengths.any()
    # The target holds the only references to copies of the descriptor and workers.
    own_desc = desc.copy()
    before = sys.getrefcount(own_desc)
    target = probe_call.MatchTarget(
        own_desc, 1, workers.copy(), lengths, tiers, np.zeros(1, np.uint8)
    )
    assert sys.getrefcount(own_desc) == before + 1
    del own_desc
    for _ in range(3):
        np.zeros_like(desc).fill(7)  # freed memory reused, if the copies were freed
    probe_call.match_at(target, array("Q", keys[:2]), probes)
    assert lengths.tolist() == want_lengths.tolist()
    assert tiers.tolist() == want_tiers.tolist()
    assert target.lists() == (want_lengths.tolist(), want_tiers.tolist())
    # The lists are the outputs now, whatever they hold (numpy's tolist, item for item).
    lengths[:] = np.random.default_rng(1).integers(-(1 << 62), 1 << 62, 16)
    lengths[1::3] = 0  # zeros between, the first and last set
    tiers[:] = np.arange(16) % 3
    got_lengths, got_tiers = target.lists()
    assert (got_lengths, got_tiers) == (lengths.tolist(), tiers.tolist())
    assert all(type(v) is int for v in got_lengths + got_tiers)
    bad_calls: list[tuple[Any, Any, str]] = [
        (np.zeros(2, np.uint32), probes, "keys"),
        (array("Q", keys[:2]), np.zeros((2, 3), np.int64), "probes"),
        (array("Q", keys[:2]), probes.astype(np.uint64), "probes"),
    ]
    for bad_keys, bad_probes, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            probe_call.match_at(target, bad_keys, bad_probes)


def test_the_c_entry_reads_rows_of_the_kernels_width() -> None:
    assert probe_call.N_COLUMNS == probe.N_COLUMNS


def test_table_workers_pads_short_tables() -> None:
    assert probe.table_workers([(3, 4), (7,)]).tolist() == [[3, 4], [7, -1]]


def test_a_guard_row_gates_the_next_row_and_credits_nothing() -> None:
    """A guard (negative length) marks the workers it hits; the next row, whose ``after``
    is that mark, credits only them; a mark no row extended is cleared with its tier."""
    table, keys = _table(64, 0)
    _buf, desc = _described(table.view_image())
    owners = list(range(32))
    rows = np.array([(0, 0, -16, probe.UNCHECKED), (1, 0, 32, -16)], np.int64)
    lengths, tiers = np.zeros(32, np.int64), np.zeros(32, np.int64)
    probe_call.match(
        desc,
        1,
        np.array(keys[:2], np.int64),
        rows,
        probe.table_workers([tuple(owners)]),
        lengths,
        tiers,
        np.zeros(1, np.uint8),
    )
    guard, first = table.get(keys[0]), table.get(keys[1])
    cases = set()
    for w in owners:
        at_guard, at_first = (guard >> (2 * w)) & 3, (first >> (2 * w)) & 3
        cases.add((bool(at_guard), bool(at_first)))
        want = (32, at_first) if at_guard and at_first else (0, 0)
        assert (lengths[w], tiers[w]) == want, w
    assert cases == {(True, True), (True, False), (False, True), (False, False)}


def test_the_c_entry_refuses_arrays_it_cannot_read_and_writes_nothing() -> None:
    table, keys = _table(32, 0)
    _buf, desc = _described(table.view_image())
    good: dict[str, Any] = {
        "desc": desc,
        "n_tables": 1,
        "keys": np.array(keys[:2], np.uint64),
        "probes": np.array([(0, 0, 16, probe.UNCHECKED), (1, 0, 32, 16)], np.int64),
        "workers": probe.table_workers([tuple(range(16))]),
        "lengths": np.zeros(16, np.int64),
        "tiers": np.zeros(16, np.int64),
        "touched": np.zeros(1, np.uint8),
    }
    frozen = np.zeros(16, np.int64)
    frozen.setflags(write=False)
    for name, bad, message in [
        ("desc", desc[:, :5].copy(), "desc"),
        ("n_tables", 2, "shards of 2 tables"),
        ("n_tables", 0, "shards of 0 tables"),
        ("keys", np.zeros(2, np.uint32), "keys"),
        ("probes", np.zeros((2, 3), np.int64), "probes"),
        ("workers", np.zeros((1, 16), np.int32), "workers"),
        ("tiers", np.zeros(15, np.int64), "lengths and tiers"),
        ("touched", np.zeros(2, np.uint8), "touched"),
        ("keys", np.array(keys[:4], np.uint64)[::2], "contiguous"),
    ]:
        with pytest.raises(ValueError, match=message):
            probe_call.match(**{**good, name: bad})
    with pytest.raises(ValueError, match="read-only"):
        probe_call.match(**{**good, "lengths": frozen})
    assert not good["lengths"].any()
    assert not good["touched"].any()
    probe_call.match(**good)
    assert good["touched"].tolist() == [1]
