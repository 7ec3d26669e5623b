"""Prefix keys and shard assignment (DESIGN §5).

The key of the first ``c`` tokens is the low 63 bits of SHA-256 over a namespace prefix
followed by those token ids as uint32 little-endian. Because every prefix of a prompt
extends the same byte string, one incremental SHA-256 pass yields the keys at all
indexed lengths: feed the tokens between consecutive lengths, and snapshot the hash
state (``copy().digest()``) at each length.
"""

from __future__ import annotations

import hashlib
import operator
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from kvcompass.hashing import MASK63, MASK64, mix64, mix64_array

__all__ = [
    "SHARD_SALT",
    "Namespace",
    "TokenIds",
    "prefix_key",
    "prefix_keys",
    "shard_of",
    "shard_of_array",
]

#: A prompt's token ids: Python ints or a 1-D numpy integer array, each in [0, 2^32).
TokenIds = Sequence[int] | NDArray[np.integer[Any]]

#: Salt XORed into a key before mixing for the shard choice, so the shard is independent
#: of the index's other uses of the same key (bucket, cells, fingerprint), which mix with
#: their own seeds. Fixed forever: changing it re-partitions every deployment.
#: Value = first 8 bytes (little-endian) of SHA-256(b"kvcompass shard salt v1").
SHARD_SALT: Final = 0x57C1A949D4BAC399

_KEY_FORMAT_TAG: Final = b"kvc-key/1"  # bump if the key encoding ever changes
_TOKEN_LIMIT: Final = 1 << 32
_TOKEN_DTYPE: Final = np.dtype("<u4")
_TOKEN_BYTES: Final = 4
#: array("I") is native-endian uint32 here; the list fast path needs little-endian 4-byte.
_FAST_LIST_PATH: Final = sys.byteorder == "little" and array("I").itemsize == _TOKEN_BYTES


@dataclass(frozen=True)
class Namespace:
    """Whose caches may match: one model identity and one sharing group (tenant)."""

    model: str
    group: str = "default"

    def __post_init__(self) -> None:
        if not self.model or not self.group:
            raise ValueError("Namespace model and group must be non-empty strings")

    @cached_property
    def prefix(self) -> bytes:
        """Version tag, then length-prefixed UTF-8 model and group.

        Length prefixes make the encoding injective (``("ab", "c")`` and ``("a", "bc")``
        differ), so keys from different namespaces are different digests.
        """
        model, group = self.model.encode(), self.group.encode()
        return _KEY_FORMAT_TAG + _u32(len(model)) + model + _u32(len(group)) + group


def _u32(n: int) -> bytes:
    return struct.pack("<I", n)


def _token_bytes(tokens: TokenIds) -> bytes:
    if isinstance(tokens, bytes | bytearray | memoryview):
        # A bytes object is also a sequence of small ints; refuse the ambiguity.
        raise TypeError("pass token ids, not bytes (use np.frombuffer(data, '<u4'))")
    if isinstance(tokens, list | tuple) and tokens and type(tokens[0]) is int and _FAST_LIST_PATH:
        # array('I') range-checks each int in C: about 5x faster than numpy for lists.
        # (A list of bools still goes to numpy, which rejects the bool dtype.)
        try:
            return array("I", tokens).tobytes()
        except (OverflowError, TypeError) as exc:
            raise ValueError(f"token ids must be integers in [0, 2^32): {exc}") from exc
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return b""
    # Check the dtype kind before casting: a cast to an integer dtype truncates floats.
    valid = arr.dtype == _TOKEN_DTYPE or (
        arr.dtype.kind in "iu" and arr.min() >= 0 and arr.max() < _TOKEN_LIMIT
    )
    if not valid:
        raise ValueError(f"token ids must be integers in [0, 2^32) (dtype {arr.dtype})")
    return np.ascontiguousarray(arr, dtype=_TOKEN_DTYPE).tobytes()


def _checked_lengths(lengths: Iterable[int]) -> list[int]:
    checked = sorted({operator.index(c) for c in lengths})
    if checked and checked[0] <= 0:
        raise ValueError(f"prefix lengths must be positive, got {checked[0]}")
    return checked


def prefix_keys(tokens: TokenIds, lengths: Iterable[int], namespace: Namespace) -> dict[int, int]:
    """63-bit keys of the first ``c`` tokens for each ``c`` in ``lengths`` (one SHA-256 pass).

    Lengths beyond the prompt are skipped (the prompt has no such prefix); duplicates
    collapse. The result is ordered by ascending length.
    """
    data = memoryview(_token_bytes(tokens))
    n_tokens = len(data) // _TOKEN_BYTES
    h = hashlib.sha256(namespace.prefix)
    keys: dict[int, int] = {}
    done = 0
    for c in _checked_lengths(lengths):
        if c > n_tokens:
            break
        h.update(data[done * _TOKEN_BYTES : c * _TOKEN_BYTES])
        keys[c] = int.from_bytes(h.copy().digest()[:8], "little") & MASK63
        done = c
    return keys


def prefix_key(tokens: TokenIds, length: int, namespace: Namespace) -> int:
    """Key of the first ``length`` tokens; the prompt must be at least that long."""
    keys = prefix_keys(tokens, (length,), namespace)
    if length not in keys:
        raise ValueError(f"prefix length {length} exceeds the prompt ({len(tokens)} tokens)")
    return keys[length]


def shard_of(key: int, n_shards: int) -> int:
    """Shard (Kafka partition) owning ``key``: mix64(key ^ SHARD_SALT) mod ``n_shards``."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be positive, got {n_shards}")
    if not 0 <= key <= MASK64:
        raise ValueError(f"key must be a 64-bit unsigned integer, got {key}")
    return mix64(key ^ SHARD_SALT) % n_shards


def shard_of_array(keys: NDArray[np.uint64], n_shards: int) -> NDArray[np.int64]:
    """Vectorised :func:`shard_of`, bit-identical to it."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be positive, got {n_shards}")
    mixed = mix64_array(np.asarray(keys, dtype=np.uint64) ^ np.uint64(SHARD_SALT))
    return (mixed % np.uint64(n_shards)).astype(np.int64)
