"""Prefix keys and shard assignment (DESIGN §5).

The key of the first ``c`` tokens is the low 63 bits of a hash over a namespace prefix
followed by those token ids as uint32 little-endian. Because every prefix of a prompt
extends the same byte string, one incremental pass yields the keys at all indexed
lengths: feed the tokens between consecutive lengths, and read the digest at each. For
XXH3 that pass is one compiled call into the xxHash C library (:mod:`kvcompass.xxh3`);
SHA-256 drives hashlib's streaming state.

Two hashes are selectable (``[index] key_hash`` in the topology, :class:`KeyHash`):
SHA-256, the paper's, and XXH3-64, about five times faster on a 4K-token prompt (see
``bench/routing.py``). A key only routes: a collision makes an edge expect a prefix a
worker does not hold, and the worker, whose cache is keyed by the tokens themselves,
recomputes; it never serves another prompt's KV. So collision resistance against an
adversary buys little here, and the default is XXH3. Each hash has its own format tag in
the namespace prefix, and the index layout digest names a non-SHA-256 hash, so the keys
of the two never meet in one snapshot.
"""

from __future__ import annotations

import hashlib
import operator
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any, Final, cast

import numba
import numpy as np
import xxhash
from numpy.typing import NDArray

from kvcompass import xxh3
from kvcompass.hashing import MASK63, MASK64, mix64, mix64_compiled
from kvcompass.namespace import Namespace

__all__ = [
    "DEFAULT_KEY_HASH",
    "SHARD_SALT",
    "KeyHash",
    "Namespace",
    "PrefixHasher",
    "TokenIds",
    "key_format_tag",
    "prefix_key",
    "prefix_keys",
    "shard_of",
    "shard_of_array",
    "token_array",
]

#: A prompt's token ids: Python ints or a 1-D numpy integer array, each in [0, 2^32).
TokenIds = Sequence[int] | NDArray[np.integer[Any]]

#: Salt XORed into a key before mixing for the shard choice, so the shard is independent
#: of the index's other uses of the same key (bucket, cells, fingerprint), which mix with
#: their own seeds. Fixed forever: changing it re-partitions every deployment.
#: Value = first 8 bytes (little-endian) of SHA-256(b"kvcompass shard salt v1").
SHARD_SALT: Final = 0x57C1A949D4BAC399
_SHARD_SALT: Final = np.uint64(SHARD_SALT)


class KeyHash(StrEnum):
    """The hash a deployment keys prefixes with (``[index] key_hash``)."""

    SHA256 = "sha256"
    XXH3 = "xxh3"


#: XXH3: 4-5x faster than SHA-256 on a 4K-token prompt, and a collision only misroutes.
DEFAULT_KEY_HASH: Final = KeyHash.XXH3

#: Bump a tag if its key encoding ever changes. SHA-256 keeps the paper-era tag (its keys
#: are pinned by tests); each hash has its own, so equal bytes never mean two encodings.
_KEY_FORMAT_TAGS: Final = {KeyHash.SHA256: b"kvc-key/1", KeyHash.XXH3: b"kvc-key/1+xxh3"}
_TOKEN_LIMIT: Final = 1 << 32
_TOKEN_DTYPE: Final = np.dtype("<u4")
_TOKEN_BYTES: Final = 4
#: array("I") is native-endian uint32 here; the list fast path needs little-endian 4-byte.
_FAST_LIST_PATH: Final = sys.byteorder == "little" and array("I").itemsize == _TOKEN_BYTES


def _sha256_key(state: Any) -> int:
    return int.from_bytes(state.digest()[:8], "little") & MASK63


def _xxh3_key(state: Any) -> int:
    return state.intdigest() & MASK63  # type: ignore[no-any-return]


#: Per hash: a streaming state seeded with the namespace prefix, and the key of what it
#: has read (its digest finalises a copy, so one state runs on over the whole prompt).
_STREAMS: Final[dict[KeyHash, tuple[Callable[[bytes], Any], Callable[[Any], int]]]] = {
    KeyHash.SHA256: (hashlib.sha256, _sha256_key),
    KeyHash.XXH3: (xxhash.xxh3_64, _xxh3_key),
}


def key_format_tag(key_hash: KeyHash | str) -> bytes:
    """The tag that starts every key prefix of ``key_hash`` (:meth:`Namespace.key_prefix`):
    keys of the two hashes never share a digest input."""
    return _KEY_FORMAT_TAGS[KeyHash(key_hash)]


def _token_bytes(tokens: TokenIds, limit: int) -> bytes | memoryview:
    """The tokens as uint32 LE bytes; of a uint32 array only the first ``limit``."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == _TOKEN_DTYPE and tokens.ndim == 1:
        # The request path's form: nothing to check, nothing past the longest length to
        # hash, and nothing to copy if contiguous.
        head = tokens[:limit]
        return head.data.cast("B") if head.flags.c_contiguous else head.tobytes()
    if isinstance(tokens, bytes | bytearray | memoryview):
        # A bytes object is also a sequence of small ints; refuse the ambiguity.
        raise TypeError("pass token ids, not bytes (use np.frombuffer(data, '<u4'))")
    if isinstance(tokens, list | tuple) and tokens and type(tokens[0]) is int and _FAST_LIST_PATH:
        # array('I') range-checks each int in C: about 3x faster than numpy for lists.
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


def token_array(tokens: TokenIds) -> NDArray[np.uint32]:
    """The tokens as a contiguous little-endian uint32 array (themselves if they are one)."""
    if (
        type(tokens) is np.ndarray
        and tokens.dtype == _TOKEN_DTYPE
        and tokens.ndim == 1
        and tokens.flags.c_contiguous
    ):
        return cast("NDArray[np.uint32]", tokens)  # a string: NDArray[...] costs µs to build
    return np.frombuffer(_token_bytes(tokens, len(tokens)), dtype=np.uint32)


def _checked_lengths(lengths: Iterable[int]) -> tuple[int, ...]:
    checked = sorted({operator.index(c) for c in lengths})
    if checked and checked[0] <= 0:
        raise ValueError(f"prefix lengths must be positive, got {checked[0]}")
    return tuple(checked)


class PrefixHasher:
    """Keys of prompts at fixed lengths in one namespace: checked once, then per prompt.

    The request path (an edge's :class:`~kvcompass.index.discovery.QueryPlanner`, a
    worker's publisher) builds one and calls :meth:`keys` or :meth:`key_list` per prompt.
    """

    def __init__(
        self,
        lengths: Iterable[int],
        namespace: Namespace,
        key_hash: KeyHash = DEFAULT_KEY_HASH,
    ) -> None:
        self._set_checked(_checked_lengths(lengths), namespace, KeyHash(key_hash))

    def _set_checked(
        self, lengths: tuple[int, ...], namespace: Namespace, key_hash: KeyHash
    ) -> None:
        self.lengths = lengths
        self.namespace = namespace
        self.key_hash = key_hash
        #: What every key's digest starts with: the hash's tag and the namespace.
        self.head = namespace.key_prefix(self.key_hash)
        #: Whether its keys are XXH3 digests of the tokens' bytes as the host holds them
        #: (little-endian hosts): the compiled digests, which callers may take too
        #: (:meth:`kvcompass.event_buffers.ShardEventBuffers.add_prefixes`).
        self.compiled = self.key_hash is KeyHash.XXH3 and sys.byteorder == "little"

    def for_namespace(self, namespace: Namespace) -> PrefixHasher:
        """This hasher's lengths and hash in ``namespace``, nothing checked again: a
        publisher or an edge meets every tenant's first prompt with one (a new hasher
        checks its lengths, about 2.5 µs for a plan's 35)."""
        hasher = object.__new__(type(self))
        hasher._set_checked(self.lengths, namespace, self.key_hash)
        return hasher

    def keys(self, tokens: TokenIds) -> dict[int, int]:
        """63-bit key of the first ``c`` tokens for each length ``c`` (one hash pass).

        Lengths beyond the prompt are skipped (the prompt has no such prefix). The result
        is ordered by ascending length.
        """
        return dict(zip(self.lengths, self.key_list(tokens), strict=False))

    def key_list(self, tokens: TokenIds) -> list[int]:
        """The values of :meth:`keys`: the keys at the first ``len(result)`` lengths."""
        return self._keys_at(tokens, self.lengths)

    def key_array(self, tokens: TokenIds) -> array[int]:
        """:meth:`key_list` as an ``array("Q")``, for compiled code to take on (an edge's
        probes)."""
        return self._key_array(tokens, self.lengths)

    def key_array_at(self, tokens: TokenIds, lengths: Sequence[int]) -> array[int]:
        """The keys at ``lengths``, an ascending selection of this hasher's lengths that
        the caller has checked, up to the prompt's length, as an array (a publisher's
        event buffers group them by shard). The tokens before the first are hashed in one
        pass: a change at a prompt's last few lengths costs a digest per length it has,
        and no hasher per selection."""
        return self._key_array(tokens, lengths)

    def _key_array(self, tokens: TokenIds, lengths: Sequence[int]) -> array[int]:
        if self.compiled:
            return self._walked_keys(tokens, lengths)
        return array("Q", self._keys_at(tokens, lengths))

    def key_at(self, tokens: TokenIds, length: int) -> int | None:
        """The key at ``length``, one of this hasher's lengths that the caller has
        checked (None: the prompt is shorter). A worker's demotions and evictions are
        one length each, several per request once its cache is full."""
        if self.compiled:
            keys = self._walked_keys(tokens, (length,))
            return keys[0] if len(keys) else None
        data = _token_bytes(tokens, length)
        if len(data) < length * _TOKEN_BYTES:
            return None
        return self._streamed_keys(data, [len(data)])[0]

    def _keys_at(self, tokens: TokenIds, lengths: Sequence[int]) -> list[int]:
        """The keys at the ascending ``lengths`` that the prompt reaches."""
        if self.compiled:
            return self._walked_keys(tokens, lengths).tolist()
        if not len(lengths):
            return []
        data = _token_bytes(tokens, lengths[-1])
        return self._streamed_keys(data, [c * _TOKEN_BYTES for c in lengths])

    def _walked_keys(self, tokens: TokenIds, lengths: Sequence[int]) -> array[int]:
        """XXH3 keys in one compiled call (little-endian hosts). A contiguous uint32
        buffer (the request path's token arrays) is read as it is; anything else is
        checked and converted first."""
        try:
            return xxh3.digests_at(self.head, tokens, lengths, MASK63)
        except (TypeError, ValueError, BufferError):
            return xxh3.digests_at(self.head, token_array(tokens), lengths, MASK63)

    def _streamed_keys(self, data: bytes | memoryview, ends: list[int]) -> list[int]:
        """One streaming state over ``data``, a key at each byte end it reaches."""
        data = memoryview(data)
        new, key_of = _STREAMS[self.key_hash]
        state = new(self.head)
        keys = []
        done = 0
        for end in ends:
            if end > len(data):
                break
            state.update(data[done:end])
            keys.append(key_of(state))
            done = end
        return keys


def prefix_keys(
    tokens: TokenIds,
    lengths: Iterable[int],
    namespace: Namespace,
    key_hash: KeyHash = DEFAULT_KEY_HASH,
) -> dict[int, int]:
    """63-bit keys of the first ``c`` tokens for each ``c`` in ``lengths`` (one pass).

    Lengths beyond the prompt are skipped (the prompt has no such prefix); duplicates
    collapse. The result is ordered by ascending length.
    """
    return PrefixHasher(lengths, namespace, key_hash).keys(tokens)


def prefix_key(
    tokens: TokenIds, length: int, namespace: Namespace, key_hash: KeyHash = DEFAULT_KEY_HASH
) -> int:
    """Key of the first ``length`` tokens; the prompt must be at least that long."""
    keys = prefix_keys(tokens, (length,), namespace, key_hash)
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
    """:func:`shard_of` of every key of a 1-D array, bit-identical to it, in one compiled
    loop: a snapshot check takes millions, where numpy's five passes cost a temporary
    each. (The compiled publisher and writer use ``shard_hash.pxd``, the same function.)"""
    if n_shards < 1:
        raise ValueError(f"n_shards must be positive, got {n_shards}")
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    out = np.empty(len(keys), dtype=np.int64)
    _shards(keys, np.uint64(n_shards), out)
    return out


@numba.njit(cache=True, nogil=True)
def _shards(keys: NDArray[np.uint64], n_shards: np.uint64, out: NDArray[np.int64]) -> None:
    for j in range(len(keys)):
        out[j] = np.int64(mix64_compiled(keys[j] ^ _SHARD_SALT) % n_shards)
