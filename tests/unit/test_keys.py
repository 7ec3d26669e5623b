"""Prefix keys (incremental SHA-256 or XXH3) and shard assignment."""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Sequence

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.hashing import MASK63, MASK64
from kvcompass.index.shard_tables import first_foreign
from kvcompass.keys import (
    DEFAULT_KEY_HASH,
    SHARD_SALT,
    KeyHash,
    Namespace,
    PrefixHasher,
    prefix_key,
    prefix_keys,
    shard_of,
    shard_of_array,
)

NS = Namespace("meta-llama/Llama-3.1-8B-Instruct")
#: The XXH3 key of the known-answer prompt, pinned like the SHA-256 one.
XXH3_LITERAL = 0x178551F24F0887EA


def one_shot_key(
    tokens: Sequence[int], model: str, group: str = "default", key_hash: str = "sha256"
) -> int:
    """The key format written out from DESIGN §5, independently of the implementation."""
    m, g = model.encode(), group.encode()
    tag = b"kvc-key/1" if key_hash == "sha256" else b"kvc-key/1+xxh3"
    data = tag + struct.pack("<I", len(m)) + m + struct.pack("<I", len(g)) + g
    data += struct.pack(f"<{len(tokens)}I", *tokens)
    if key_hash == "sha256":
        return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") & MASK63
    return xxhash.xxh3_64_intdigest(data) & MASK63


HASHES = pytest.mark.parametrize("key_hash", list(KeyHash), ids=str)


def test_known_answer_sha256() -> None:
    tokens = [128000, 9906, 1917, 0, 2**32 - 1]
    keys = prefix_keys(tokens, [1, 3, 5], NS, KeyHash.SHA256)
    assert keys == {c: one_shot_key(tokens[:c], NS.model) for c in (1, 3, 5)}
    # Pinned literal: keys live in snapshots and on the wire, so the format must not drift.
    assert keys[5] == one_shot_key(tokens, NS.model) == 0x6D5CD33F3FDA482E


def test_known_answer_xxh3() -> None:
    tokens = [128000, 9906, 1917, 0, 2**32 - 1]
    keys = prefix_keys(tokens, [1, 3, 5], NS, KeyHash.XXH3)
    assert keys == {c: one_shot_key(tokens[:c], NS.model, key_hash="xxh3") for c in (1, 3, 5)}
    assert keys[5] == XXH3_LITERAL


def test_default_hash_is_xxh3() -> None:
    # The measured choice (bench/routing.py): a collision only misroutes.
    assert DEFAULT_KEY_HASH is KeyHash.XXH3
    tokens = [7, 8, 9]
    assert prefix_keys(tokens, [3], NS) == prefix_keys(tokens, [3], NS, KeyHash.XXH3)


def test_two_hashes_never_share_an_encoding() -> None:
    """Each hash hashes its own tag, so a key never means the same bytes under both."""
    sha, xxh = NS.key_prefix(KeyHash.SHA256), NS.key_prefix(KeyHash.XXH3)
    assert sha == NS.prefix
    assert sha != xxh
    tokens = list(range(64))
    assert (
        prefix_keys(tokens, [16, 64], NS, KeyHash.SHA256).values()
        != prefix_keys(tokens, [16, 64], NS, KeyHash.XXH3).values()
    )


def test_hasher_refuses_an_unknown_hash() -> None:
    with pytest.raises(ValueError, match="md5"):
        PrefixHasher([1], NS, "md5")  # type: ignore[arg-type]


def test_namespace_prefix_is_length_prefixed() -> None:
    ns = Namespace("m", "g")
    assert ns.prefix == b"kvc-key/1\x01\x00\x00\x00m\x01\x00\x00\x00g"
    assert pickle.loads(pickle.dumps(ns)) == ns


@HASHES
def test_every_length_equals_one_shot_hash_of_that_prefix(key_hash: KeyHash) -> None:
    tokens = list(range(1000, 1300))
    lengths = [16, 1, 300, 64, 128, 255]
    keys = prefix_keys(tokens, lengths, NS, key_hash)
    assert list(keys) == sorted(lengths)
    hasher = PrefixHasher(lengths, NS, key_hash)
    for tries in range(2):  # a hasher is reusable: no state leaks between prompts
        assert hasher.keys(np.array(tokens, dtype=np.uint32)) == keys, tries
    for c, key in keys.items():
        assert key == one_shot_key(tokens[:c], NS.model, key_hash=key_hash)
        assert key == prefix_key(tokens, c, NS, key_hash)
        assert 0 <= key <= MASK63


@HASHES
def test_keys_at_a_selection_of_lengths_are_those_prefixes_keys(key_hash: KeyHash) -> None:
    tokens = np.arange(2000, 2300, dtype=np.uint32)
    hasher = PrefixHasher([16, 32, 64, 128, 256, 512], NS, key_hash)
    for selection in ([128, 256], [32], [16, 64, 512], []):
        got = hasher.key_array_at(tokens, selection).tolist()
        within = [c for c in selection if c <= len(tokens)]  # 512 is past the prompt
        assert got == [
            one_shot_key(tokens[:c].tolist(), NS.model, key_hash=key_hash) for c in within
        ]


@HASHES
def test_the_key_at_one_length_is_that_prefix_s_key(key_hash: KeyHash) -> None:
    tokens = np.arange(500, 800, dtype=np.uint32)
    hasher = PrefixHasher([16, 256, 512], NS, key_hash)
    for length in (16, 256):
        assert hasher.key_at(tokens, length) == prefix_key(tokens, length, NS, key_hash)
    assert hasher.key_at(tokens, 512) is None  # past the prompt


@HASHES
def test_namespaces_never_share_keys(key_hash: KeyHash) -> None:
    tokens = [1, 2, 3, 4]
    variants = [
        Namespace("llama"),
        Namespace("llama", "tenant-a"),
        Namespace("llama", "tenant-b"),
        Namespace("qwen"),
        Namespace("ab", "c"),
        Namespace("a", "bc"),
    ]
    keys = {prefix_key(tokens, 4, ns, key_hash) for ns in variants}
    assert len(keys) == len(variants)


@HASHES
def test_a_hasher_for_another_namespace_keys_as_a_new_one_there(key_hash: KeyHash) -> None:
    """for_namespace skips the lengths' checks: its keys must be a fresh hasher's."""
    tokens = np.arange(1, 301, dtype=np.uint32)
    tenant = Namespace("llama", "tenant-a")
    base = PrefixHasher([16, 64, 256, 64], Namespace("llama"), key_hash)
    moved = base.for_namespace(tenant)
    fresh = PrefixHasher([16, 64, 256], tenant, key_hash)
    assert moved.keys(tokens) == fresh.keys(tokens)
    assert list(moved.key_array(tokens)) == list(fresh.key_array(tokens))
    assert (moved.lengths, moved.namespace, moved.key_hash) == (base.lengths, tenant, key_hash)
    assert base.keys(tokens) != moved.keys(tokens)  # the original keeps its namespace
    assert base.keys(tokens) == PrefixHasher([16, 64, 256], Namespace("llama"), key_hash).keys(
        tokens
    )


def test_lengths_beyond_prompt_are_skipped_and_duplicates_collapse() -> None:
    keys = prefix_keys([5, 6, 7], [2, 3, 3, 4, 100], NS)
    assert list(keys) == [2, 3]
    assert prefix_keys([], [1, 2], NS) == {}
    with pytest.raises(ValueError, match="exceeds the prompt"):
        prefix_key([5, 6, 7], 4, NS)


@pytest.mark.parametrize(
    "tokens",
    [
        [-1, 2],
        [1, 2**32],
        [1.0, 2.0],
        np.array([1, -5], dtype=np.int32),
        np.array([2**40], dtype=np.uint64),
        np.array([[1, 2], [3, 4]]),
        [True, False],
    ],
    ids=["negative", "2^32", "float", "np-negative", "np-big", "2d", "bool"],
)
def test_invalid_tokens_rejected(tokens: object) -> None:
    with pytest.raises(ValueError, match=r"token ids must be integers|one-dimensional"):
        prefix_keys(tokens, [1], NS)  # type: ignore[arg-type]


def test_bytes_tokens_rejected_as_ambiguous() -> None:
    with pytest.raises(TypeError, match="not bytes"):
        prefix_keys(b"\x01\x00\x00\x00", [1], NS)


@pytest.mark.parametrize("bad", [0, -16])
def test_non_positive_lengths_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        prefix_keys([1, 2, 3], [2, bad], NS)


def test_non_integer_lengths_rejected() -> None:
    with pytest.raises(TypeError):
        prefix_keys([1, 2, 3], [1.5], NS)  # type: ignore[list-item]


def test_empty_namespace_fields_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        Namespace("")
    with pytest.raises(ValueError, match="non-empty"):
        Namespace("llama", "")


def test_namespace_hashes_by_value_and_a_pickle_hashes_afresh() -> None:
    """The hash is kept once computed; a pickled one (string hashes differ between
    processes) must not carry it to another process, where dict lookups would miss."""
    ns = Namespace("llama", "tenant-7")
    assert hash(ns) == hash(Namespace("llama", "tenant-7")) == hash(("llama", "tenant-7"))
    assert {ns: 1}[Namespace("llama", "tenant-7")] == 1
    hash(ns)
    copy = pickle.loads(pickle.dumps(ns))
    assert copy == ns
    assert hash(copy) == hash(ns)
    # Only the strings travel: the hash is computed in the process that reads them.
    assert ns.__reduce__() == (Namespace, ("llama", "tenant-7"))


def test_a_namespace_is_an_immutable_value() -> None:
    ns = Namespace("llama", "tenant-7")
    assert repr(ns) == "Namespace(model='llama', group='tenant-7')"
    assert Namespace("llama").group == "default"
    assert ns != ("llama", "tenant-7")  # equal hashes, but not a namespace
    assert ns != Namespace("llama", "tenant-8")
    assert len({ns, Namespace("llama", "tenant-7"), Namespace("llama")}) == 2
    with pytest.raises(AttributeError):
        ns.model = "qwen"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ns.__init__("qwen", "x")  # type: ignore[misc]
    assert (ns.model, ns.group) == ("llama", "tenant-7")
    with pytest.raises(TypeError):
        Namespace(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Namespace(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["<u4", ">u4", "int64", "uint16", "int32", "uint64"])
def test_numpy_and_list_inputs_agree(dtype: str) -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    expected = prefix_keys(tokens, [1, 7, 15], NS)
    assert prefix_keys(np.array(tokens, dtype=dtype), [1, 7, 15], NS) == expected
    strided = np.repeat(np.array(tokens, dtype=dtype), 2)[::2]  # non-contiguous view
    assert prefix_keys(strided, np.array([1, 7, 15]), NS) == expected
    # Lengths short of the prompt: only a head is hashed (uint32 arrays: not even copied).
    assert prefix_keys(np.array(tokens, dtype=dtype), [1, 7], NS) == {
        c: expected[c] for c in (1, 7)
    }


@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=80),
    lengths=st.lists(st.integers(1, 100), max_size=12),
    key_hash=st.sampled_from(list(KeyHash)),
)
def test_incremental_equals_one_shot(
    tokens: list[int], lengths: list[int], key_hash: KeyHash
) -> None:
    keys = prefix_keys(tokens, lengths, NS, key_hash)
    assert set(keys) == {c for c in lengths if c <= len(tokens)}
    for c, key in keys.items():
        assert key == one_shot_key(tokens[:c], NS.model, key_hash=key_hash)


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=1500),
    lengths=st.lists(st.integers(1, 1600), min_size=1, max_size=40),
)
def test_long_prompts_keys_are_their_prefixes_one_shot_keys(
    tokens: list[int], lengths: list[int]
) -> None:
    """XXH3 keys come from the compiled walk, whose large-input path (past 240 bytes)
    carries 1,024-byte blocks from one length to the next."""
    hasher = PrefixHasher(lengths, NS, KeyHash.XXH3)
    array = np.array(tokens, dtype=np.uint32)
    within = [c for c in hasher.lengths if c <= len(tokens)]
    want = [one_shot_key(tokens[:c], NS.model, key_hash="xxh3") for c in within]
    assert hasher.key_list(array) == want
    assert hasher.key_list(tokens) == want  # a list is converted, then walked alike
    assert hasher.key_array_at(array, within[-3:]).tolist() == want[-3:]
    assert [hasher.key_at(array, c) for c in within[-2:]] == want[-2:]


def test_the_streamed_keys_equal_the_compiled_ones() -> None:
    """The C library's stream (one key, or a host whose byte order the walk cannot read)
    gives the walk's keys."""
    tokens = np.random.default_rng(7).integers(0, 2**32, 3000, dtype=np.uint32)
    compiled = PrefixHasher([16, 64, 200, 256, 1024, 2048, 2900], NS, KeyHash.XXH3)
    streamed = PrefixHasher(compiled.lengths, NS, KeyHash.XXH3)
    streamed.compiled = False
    assert streamed.key_list(tokens) == compiled.key_list(tokens)
    selection = [200, 2048]
    assert streamed.key_array_at(tokens, selection).tolist() == (
        compiled.key_array_at(tokens, selection).tolist()
    )


# --- shards --------------------------------------------------------------------------------


def test_shard_salt_is_the_documented_derivation() -> None:
    digest = hashlib.sha256(b"kvcompass shard salt v1").digest()
    assert int.from_bytes(digest[:8], "little") == SHARD_SALT


@pytest.mark.parametrize("n_shards", [1, 2, 7, 64, 1000])
def test_shard_of_array_matches_scalar(n_shards: int) -> None:
    rng = np.random.default_rng(7)
    keys = np.concatenate(
        [
            rng.integers(0, 2**63, size=2000, dtype=np.uint64),
            np.array([0, 1, MASK63, MASK64, SHARD_SALT], dtype=np.uint64),
        ]
    )
    shards = shard_of_array(keys, n_shards)
    assert shards.dtype == np.int64
    assert shards.tolist() == [shard_of(int(k), n_shards) for k in keys]
    assert shard_of_array(keys.tolist(), n_shards).tolist() == shards.tolist()
    assert all(0 <= s < n_shards for s in shards.tolist())


@given(
    st.lists(st.integers(0, MASK64), max_size=40),
    st.integers(1, 20),
    st.data(),
)
def test_the_compiled_shard_check_finds_the_first_foreign_key(
    keys: list[int], n_shards: int, data: st.DataObject
) -> None:
    # Every write to a shard (the MU's batches, ShardTables' columns) is checked so.
    shard = data.draw(st.integers(0, n_shards - 1))
    own = [k for k in keys if shard_of(k, n_shards) == shard]
    for column in (own, own + keys, keys):
        array = np.array(column, dtype=np.uint64)
        owners = shard_of_array(array, n_shards).tolist()
        want = next((j for j, owner in enumerate(owners) if owner != shard), -1)
        assert first_foreign(array, n_shards, shard) == want
        array.setflags(write=False)  # as decoded from the wire
        assert first_foreign(array, n_shards, shard) == want


@pytest.mark.parametrize("source", ["random", "sequential"])
def test_shards_spread_evenly(source: str) -> None:
    n, n_shards = 100_000, 64
    if source == "random":
        keys = np.random.default_rng(11).integers(0, 2**63, size=n, dtype=np.uint64)
    else:  # structured keys must spread too: the mix, not the key, decides the shard
        keys = np.arange(n, dtype=np.uint64)
    counts = np.bincount(shard_of_array(keys, n_shards), minlength=n_shards)
    expected = n / n_shards
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 63 degrees of freedom: mean 63, sd ~11; 130 is about p = 1e-6 for a fair spread.
    assert chi2 < 130, (chi2, counts.min(), counts.max())


def test_shard_arguments_validated() -> None:
    with pytest.raises(ValueError, match="n_shards"):
        shard_of(1, 0)
    with pytest.raises(ValueError, match="n_shards"):
        shard_of_array(np.zeros(1, dtype=np.uint64), 0)
    with pytest.raises(ValueError, match="64-bit"):
        shard_of(-1, 4)
    for bad in (-1, MASK64 + 1):
        with pytest.raises(OverflowError):
            shard_of_array([1, bad, 2], 4)  # type: ignore[arg-type]
