"""The compiled XXH3-64 digests against the xxhash package."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.xxh3 import digests_at

#: Input sizes in bytes where XXH3 changes path or block: empty, 1-3, 4-8, 9-16, 17-128,
#: 129-240, then 64-byte stripes in 1,024-byte blocks (a block is folded only once a
#: longer input follows it).
EDGES = [0, 1, 3, 4, 8, 9, 16, 17, 32, 33, 128, 129, 240, 241, 256, 1023, 1024, 1025]
EDGES += [1088, 2047, 2048, 2049, 3072, 5000]


def expected(head: bytes, body: np.ndarray, ends: list[int]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(head + body[:e].tobytes()) for e in ends]


def digests(head: bytes, body: np.ndarray, ends: list[int], mask: int = (1 << 64) - 1) -> list[int]:
    return [int(d) for d in digests_at(head, body, ends, mask)]


@pytest.mark.parametrize("head_bytes", [0, 1, 3, 14, 32, 37])
def test_every_size_class_and_block_boundary_matches_xxhash(head_bytes: int) -> None:
    rng = np.random.default_rng(head_bytes)
    head = rng.bytes(head_bytes)
    body = rng.integers(0, 2**32, 1400, dtype=np.uint32)
    # Body lengths (items of 4 bytes) whose inputs land on and around each edge.
    ends = sorted({max(0, (size - head_bytes) // 4) + d for size in EDGES for d in (0, 1)})
    ends = [e for e in ends if e <= len(body)]
    assert digests(head, body, ends) == expected(head, body, ends)
    for e in ends:  # and each alone, with no shorter input before it
        assert digests(head, body, [e]) == expected(head, body, [e])


@settings(max_examples=200, deadline=None)
@given(
    head=st.binary(max_size=40),
    words=st.lists(st.integers(0, 2**32 - 1), max_size=2000),
    ends=st.lists(st.integers(0, 2100), max_size=30),
)
def test_digests_of_any_prefixes_match_xxhash(
    head: bytes, words: list[int], ends: list[int]
) -> None:
    body = np.array(words, dtype=np.uint32)
    ascending = sorted(set(ends))
    within = [e for e in ascending if e <= len(body)]
    # Written up to the first end past the body, then it stops.
    assert digests(head, body, ascending) == expected(head, body, within)


def test_the_mask_keeps_the_low_bits() -> None:
    body = np.arange(700, dtype=np.uint32)
    full = digests(b"kvc", body, [5, 100, 700])
    low = digests(b"kvc", body, [5, 100, 700], mask=(1 << 63) - 1)
    assert low == [d & ((1 << 63) - 1) for d in full]
    assert any(d >> 63 for d in full)  # the mask had work to do


def test_no_end_within_the_body_writes_nothing() -> None:
    assert digests(b"x", np.arange(3, dtype=np.uint32), []) == []
    assert digests(b"x", np.arange(3, dtype=np.uint32), [4, 9]) == []
    assert digests(b"", np.zeros(0, np.uint32), [0]) == [xxhash.xxh3_64_intdigest(b"")]


def test_a_body_of_other_items_or_descending_ends_is_refused() -> None:
    with pytest.raises(TypeError, match="uint32 items"):
        digests_at(b"x", np.arange(3, dtype=np.int64), [1], 0)
    with pytest.raises(ValueError, match="ends must ascend"):
        digests_at(b"x", np.arange(9, dtype=np.uint32), [4, 2], 0)


def test_a_read_only_body_is_hashed_as_it_is() -> None:
    body = np.frombuffer(np.arange(500, dtype=np.uint32).tobytes(), np.uint32)
    assert not body.flags.writeable
    assert digests(b"h", body, [7, 500]) == expected(b"h", body, [7, 500])
