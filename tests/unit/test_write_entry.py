"""The write kernel's C entry (a maintenance unit's staged writes) writes exactly what
the numba kernel called from Python writes, for every cell and fingerprint width, through
growth and locator rebuilds; it refuses a target or range it cannot run."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvcompass.index import IndexCorrupt, LudoTable
from kvcompass.index.addresses import address_of
from kvcompass.index.write_call import write_at


def _batch(
    rng: random.Random, held: list[int], value_mask: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inserts of new keys, field updates and removals of held ones, in one batch."""
    keys, clear, bits = [], [], []
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if held and roll < 0.25:  # remove
            keys.append(rng.choice(held))
            clear.append(value_mask)
            bits.append(0)
        elif held and roll < 0.5:  # one 2-bit field of a held key
            shift = 2 * rng.randrange(value_mask.bit_length() // 2)
            keys.append(rng.choice(held))
            clear.append(3 << shift)
            bits.append(rng.randint(1, 3) << shift)
        else:
            key = rng.getrandbits(63)
            held.append(key)
            keys.append(key)
            clear.append(value_mask)
            bits.append(rng.randint(1, value_mask))
    return (
        np.array(keys, np.uint64),
        np.array(clear, np.uint64),
        np.array(bits, np.uint64),
    )


@pytest.mark.parametrize(
    ("value_bits", "fingerprint_bits"), [(32, 0), (32, 8), (32, 16), (64, 0), (64, 16)]
)
def test_the_c_entry_writes_what_the_python_called_kernel_writes(
    value_bits: int, fingerprint_bits: int
) -> None:
    by_python, by_address = (
        LudoTable.with_capacity(
            16,
            value_bits=value_bits,
            fingerprint_bits=fingerprint_bits,
            rng=random.Random(11),
        )
        for _ in range(2)
    )
    rng = random.Random(value_bits * 100 + fingerprint_bits)
    held: list[int] = []
    resets = 0
    for _ in range(600):
        keys, clear, bits = _batch(rng, held, by_python.geometry.value_mask)
        by_python.write_bits_many(keys, clear, bits)
        by_address.write_at(address_of(keys), address_of(clear), address_of(bits), len(keys))
        changed = by_python.changed
        want, got = by_python.take_patch(), by_address.take_patch()
        # ShardTables sends a changed table's patch unchecked: it is never empty.
        assert changed == (not want.is_empty)
        assert not by_python.changed
        resets += want.othello_reset is not None
        assert got.generation == want.generation
        assert (got.reload is None) == (want.reload is None)
        assert (got.othello_reset is None) == (want.othello_reset is None)
        assert by_address.snapshot_parts() == by_python.snapshot_parts()
    assert by_address.geometry.generation >= 3  # it grew, through the C entry too
    assert resets >= 1  # and rebuilt its locator


def test_a_target_or_range_it_cannot_run_is_refused_before_the_call() -> None:
    table = LudoTable.with_capacity(16)
    keys = np.array([5], np.uint64)
    at = address_of(keys)
    target = table._write_target
    with pytest.raises(ValueError, match="cells of 3"):
        write_at((target[0], target[1], 3, *target[3:]), at, at, at, 1, 0)
    with pytest.raises(ValueError, match="fingerprints of 4"):
        write_at((*target[:4], 4, target[5]), at, at, at, 1, 0)
    with pytest.raises(ValueError, match=r"writes 2\.\.1"):
        write_at(target, at, at, at, 1, 2)
    assert table.count == 0


def test_a_kernel_stop_with_an_unknown_status_poisons_the_table() -> None:
    """A status the table does not know (a kernel bug) must not loop or go unnoticed:
    the table refuses everything from then on."""
    table = LudoTable.with_capacity(16)
    with pytest.raises(IndexCorrupt, match="unknown status 7"):
        table._resume_after(7, 0)
    assert table.corrupt
    with pytest.raises(IndexCorrupt):
        table.take_patch()
