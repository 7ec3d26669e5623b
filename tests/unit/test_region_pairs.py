"""A region's (length, key) pairs built in C are the list comprehension's: the pairs
whose key position the prompt reached, in order, keys as unsigned 63-bit ints."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcompass.index.region_pairs import region_pairs


@given(
    keys=st.lists(st.integers(0, (1 << 63) - 1), max_size=12),
    planned=st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(0, 15)), max_size=8),
)
def test_pairs_are_the_reached_positions_keys_in_order(
    keys: list[int], planned: list[tuple[int, int]]
) -> None:
    want = [(c, keys[i]) for c, i in planned if i < len(keys)]
    assert region_pairs(tuple(planned), array("Q", keys)) == want
    assert region_pairs(tuple(planned), np.array(keys, np.uint64)) == want


def test_keys_that_are_not_uint64_are_refused() -> None:
    for keys in (array("I", [1, 2]), np.array([1.0, 2.0]), np.arange(4, dtype=np.uint64)[::2]):
        with pytest.raises(ValueError, match=r"keys|contiguous"):
            region_pairs(((16, 0),), keys)
