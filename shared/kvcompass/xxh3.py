"""XXH3-64 compiled: the digests of every prefix of one byte string, in one call.

A prompt's keys are the digests of its prefixes at a few dozen lengths. The xxhash
package's streaming state computes them in C, but driving it from Python (an update and
a digest per length) costs more than hashing: 6 µs for a 3,400-token prompt at 35
lengths (11 inside the simulator), whose bytes alone take half a microsecond. This is
the algorithm of the xxHash specification (``doc/xxhash_spec.md``: XXH3-64, seed 0, the
default secret) written for numba, so one call walks the string once and finalises a
digest at each length: the large-input path keeps its accumulators across lengths (a
prefix's full 1,024-byte blocks are the same for every longer prefix) and finalises
each length on a copy. Every digest equals ``xxhash.xxh3_64_intdigest`` of the same
bytes (property tests pin it).

The input is a head of bytes (a namespace's fixed encoding) followed by a body of
uint32 items (the tokens, as little-endian bytes): the kernel joins them in a scratch
buffer, so callers pass the token array as it is. Words are read in the host's byte
order: call it on little-endian hosts only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

__all__ = ["digests_at", "warm_up"]

F = TypeVar("F", bound=Callable[..., Any])

_U8 = np.uint64(8)
_U15 = np.uint64(15)
_U16 = np.uint64(16)
_U24 = np.uint64(24)
_U28 = np.uint64(28)
_U29 = np.uint64(29)
_U32 = np.uint64(32)
_U33 = np.uint64(33)
_U35 = np.uint64(35)
_U37 = np.uint64(37)
_U40 = np.uint64(40)
_U47 = np.uint64(47)
_U49 = np.uint64(49)
_BYTE = np.uint64(0xFF)
_M32 = np.uint64(0xFFFFFFFF)
_P32_1 = np.uint64(0x9E3779B1)
_P32_2 = np.uint64(0x85EBCA77)
_P32_3 = np.uint64(0xC2B2AE3D)
_P64_1 = np.uint64(0x9E3779B185EBCA87)
_P64_2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P64_3 = np.uint64(0x165667B19E3779F9)
_P64_4 = np.uint64(0x85EBCA77C2B2AE63)
_P64_5 = np.uint64(0x27D4EB2F165667C5)
_PMX1 = np.uint64(0x165667919E3779F9)
_PMX2 = np.uint64(0x9FB21C651E98DF25)

#: The specification's default 192-byte secret.
_SECRET = np.frombuffer(
    bytes.fromhex(
        "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
        "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
        "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
        "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
        "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
        "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
    ),
    dtype=np.uint8,
)
_STRIPE = 64
_STRIPES_PER_BLOCK = (len(_SECRET) - _STRIPE) // 8  # 16
_BLOCK = _STRIPE * _STRIPES_PER_BLOCK  # 1,024 bytes
_SCRAMBLE_AT = len(_SECRET) - _STRIPE  # the secret's last 64 bytes
_LAST_STRIPE_AT = len(_SECRET) - _STRIPE - 7
_MERGE_AT = 11


def _compiled(fn: F) -> F:
    # cache=True: the machine code is kept beside this module, compiled once per machine.
    return cast(F, numba.njit(cache=True, nogil=True)(fn))


def _copy_typing(typingctx: Any, dst: Any, at: Any, src: Any, count: Any) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        to = context.make_array(sig.args[0])(context, builder, args[0]).data
        start = context.make_array(sig.args[2])(context, builder, args[2]).data
        to = builder.gep(to, [args[1]])
        memcpy(builder, to, builder.bitcast(start, to.type), args[3], 1)

    return types.void(dst, at, src, count), codegen


memcpy: Any = cgutils.raw_memcpy
#: ``_copy_bytes(dst, at, src, count)``: the first ``count`` bytes of array ``src`` into
#: the uint8 array ``dst`` from byte ``at``, as one memcpy (the caller checks the
#: bounds). numba's slice assignment copies a byte at a time: 3.5 µs for a 3,400-token
#: prompt, against 0.1.
_copy_bytes: Any = intrinsic(_copy_typing)


@_compiled
def _read32(b: NDArray[np.uint8], i: int) -> np.uint64:
    """Little-endian uint32 at byte ``i``, widened (LLVM folds the bytes into one load)."""
    return (
        np.uint64(b[i])
        | (np.uint64(b[i + 1]) << _U8)
        | (np.uint64(b[i + 2]) << _U16)
        | (np.uint64(b[i + 3]) << _U24)
    )


@_compiled
def _read64(b: NDArray[np.uint8], i: int) -> np.uint64:
    """Little-endian uint64 at byte ``i``."""
    return _read32(b, i) | (_read32(b, i + 4) << _U32)


@_compiled
def _fold128(a: np.uint64, b: np.uint64) -> np.uint64:
    """Low xor high half of the 128-bit product a·b (from four 32×32 products)."""
    alo, ahi, blo, bhi = a & _M32, a >> _U32, b & _M32, b >> _U32
    lo_lo = alo * blo
    hi_lo = ahi * blo
    cross = (lo_lo >> _U32) + (hi_lo & _M32) + alo * bhi
    upper = (hi_lo >> _U32) + (cross >> _U32) + ahi * bhi
    lower = (cross << _U32) | (lo_lo & _M32)
    return lower ^ upper


@_compiled
def _avalanche(x: np.uint64) -> np.uint64:
    x ^= x >> _U37
    x *= _PMX1
    return x ^ (x >> _U32)


@_compiled
def _avalanche_xxh64(x: np.uint64) -> np.uint64:
    x ^= x >> _U33
    x *= _P64_2
    x ^= x >> _U29
    x *= _P64_3
    return x ^ (x >> _U32)


@_compiled
def _mix16(b: NDArray[np.uint8], i: int, s: NDArray[np.uint8], at: int) -> np.uint64:
    return _fold128(_read64(b, i) ^ _read64(s, at), _read64(b, i + 8) ^ _read64(s, at + 8))


@_compiled
def _up_to_16(b: NDArray[np.uint8], n: int, s: NDArray[np.uint8]) -> np.uint64:
    if n > 8:
        low = (_read64(s, 24) ^ _read64(s, 32)) ^ _read64(b, 0)
        high = (_read64(s, 40) ^ _read64(s, 48)) ^ _read64(b, n - 8)
        swapped = np.uint64(0)
        x = low
        for _ in range(8):  # bswap64(low)
            swapped = (swapped << _U8) | (x & _BYTE)
            x >>= _U8
        return _avalanche(np.uint64(n) + swapped + high + _fold128(low, high))
    if n >= 4:
        combined = _read32(b, n - 4) | (_read32(b, 0) << _U32)
        v = (_read64(s, 8) ^ _read64(s, 16)) ^ combined
        v ^= ((v << _U49) | (v >> _U15)) ^ ((v << _U24) | (v >> _U40))
        v *= _PMX2
        v ^= (v >> _U35) + np.uint64(n)
        v *= _PMX2
        return v ^ (v >> _U28)
    if n > 0:
        combined = (
            np.uint64(b[n - 1])
            | (np.uint64(n) << _U8)
            | (np.uint64(b[0]) << _U16)
            | (np.uint64(b[n >> 1]) << _U24)
        )
        return _avalanche_xxh64((_read32(s, 0) ^ _read32(s, 4)) ^ combined)
    return _avalanche_xxh64(_read64(s, 56) ^ _read64(s, 64))


@_compiled
def _up_to_240(b: NDArray[np.uint8], n: int, s: NDArray[np.uint8]) -> np.uint64:
    acc = np.uint64(n) * _P64_1
    if n <= 128:
        for i in range((n - 1) >> 5, -1, -1):
            acc += _mix16(b, 16 * i, s, 32 * i)
            acc += _mix16(b, n - 16 * i - 16, s, 32 * i + 16)
        return _avalanche(acc)
    for i in range(8):
        acc += _mix16(b, 16 * i, s, 16 * i)
    acc = _avalanche(acc)
    for i in range(8, n >> 4):
        acc += _mix16(b, 16 * i, s, 16 * (i - 8) + 3)
    acc += _mix16(b, n - 16, s, 119)
    return _avalanche(acc)


#: The eight 64-bit accumulators of the large-input path.
_Lanes = tuple[
    np.uint64, np.uint64, np.uint64, np.uint64, np.uint64, np.uint64, np.uint64, np.uint64
]


@_compiled
def _multiply_halves(data: np.uint64, secret: np.uint64) -> np.uint64:
    keyed = data ^ secret
    return (keyed & _M32) * (keyed >> _U32)


@_compiled
def _stripes(
    acc: _Lanes, w: NDArray[np.uint64], start: int, count: int, secret: NDArray[np.uint64]
) -> _Lanes:
    """Accumulate ``count`` stripes from word ``start``, stripe k keyed by the secret's
    words k..k+7. Written out in locals: as arrays or tuples of lanes, LLVM kept the
    lanes in memory and hashed at a quarter of the speed."""
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    for k in range(count):
        i = start + 8 * k
        d0, d1, d2, d3 = w[i], w[i + 1], w[i + 2], w[i + 3]
        d4, d5, d6, d7 = w[i + 4], w[i + 5], w[i + 6], w[i + 7]
        a0 += d1 + _multiply_halves(d0, secret[k])
        a1 += d0 + _multiply_halves(d1, secret[k + 1])
        a2 += d3 + _multiply_halves(d2, secret[k + 2])
        a3 += d2 + _multiply_halves(d3, secret[k + 3])
        a4 += d5 + _multiply_halves(d4, secret[k + 4])
        a5 += d4 + _multiply_halves(d5, secret[k + 5])
        a6 += d7 + _multiply_halves(d6, secret[k + 6])
        a7 += d6 + _multiply_halves(d7, secret[k + 7])
    return (a0, a1, a2, a3, a4, a5, a6, a7)


@_compiled
def _last_stripe(acc: _Lanes, b: NDArray[np.uint8], n: int, s: NDArray[np.uint8]) -> _Lanes:
    """Accumulate the input's last 64 bytes (at any offset) with the secret at 121."""
    i, k = n - _STRIPE, _LAST_STRIPE_AT
    d0, d1, d2, d3 = _read64(b, i), _read64(b, i + 8), _read64(b, i + 16), _read64(b, i + 24)
    d4, d5, d6, d7 = _read64(b, i + 32), _read64(b, i + 40), _read64(b, i + 48), _read64(b, i + 56)
    return (
        acc[0] + d1 + _multiply_halves(d0, _read64(s, k)),
        acc[1] + d0 + _multiply_halves(d1, _read64(s, k + 8)),
        acc[2] + d3 + _multiply_halves(d2, _read64(s, k + 16)),
        acc[3] + d2 + _multiply_halves(d3, _read64(s, k + 24)),
        acc[4] + d5 + _multiply_halves(d4, _read64(s, k + 32)),
        acc[5] + d4 + _multiply_halves(d5, _read64(s, k + 40)),
        acc[6] + d7 + _multiply_halves(d6, _read64(s, k + 48)),
        acc[7] + d6 + _multiply_halves(d7, _read64(s, k + 56)),
    )


@_compiled
def _scrambled(acc: _Lanes, secret: NDArray[np.uint64]) -> _Lanes:
    """The end of a block: each lane mixed with the secret's last eight words."""
    k = _SCRAMBLE_AT // 8
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    return (
        ((a0 ^ (a0 >> _U47)) ^ secret[k]) * _P32_1,
        ((a1 ^ (a1 >> _U47)) ^ secret[k + 1]) * _P32_1,
        ((a2 ^ (a2 >> _U47)) ^ secret[k + 2]) * _P32_1,
        ((a3 ^ (a3 >> _U47)) ^ secret[k + 3]) * _P32_1,
        ((a4 ^ (a4 >> _U47)) ^ secret[k + 4]) * _P32_1,
        ((a5 ^ (a5 >> _U47)) ^ secret[k + 5]) * _P32_1,
        ((a6 ^ (a6 >> _U47)) ^ secret[k + 6]) * _P32_1,
        ((a7 ^ (a7 >> _U47)) ^ secret[k + 7]) * _P32_1,
    )


@_compiled
def _merged(acc: _Lanes, n: int, s: NDArray[np.uint8]) -> np.uint64:
    result = np.uint64(n) * _P64_1
    for k in range(4):
        at = _MERGE_AT + 16 * k
        result += _fold128(acc[2 * k] ^ _read64(s, at), acc[2 * k + 1] ^ _read64(s, at + 8))
    return _avalanche(result)


@_compiled
def digests_at(
    head: NDArray[np.uint8],
    body: NDArray[np.uint32],
    ends: NDArray[np.int64],
    mask: np.uint64,
    out: NDArray[np.uint64],
) -> int:
    """``out[j] = XXH3-64(head + body[:ends[j]]) & mask``, the body's items as
    little-endian bytes, for the ascending ``ends`` up to the first one past the body;
    returns how many it wrote."""
    s = _SECRET
    count = 0
    while count < len(ends) and ends[count] <= len(body):
        count += 1
    if count == 0:
        return 0
    h = len(head)
    size = h + 4 * ends[count - 1]
    # Whole words, so that stripes (64-byte aligned from the start) read as uint64.
    data = np.empty(-(-size // 8) * 8, dtype=np.uint8)
    _copy_bytes(data, 0, head, h)
    _copy_bytes(data, h, body, size - h)
    w = data.view(np.uint64)
    secret = s.view(np.uint64)
    acc = (_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1)
    folded = 0  # full blocks in ``acc``: a block is folded once a longer input follows it
    for j in range(count):
        n = h + 4 * ends[j]
        if n <= 16:
            out[j] = _up_to_16(data, n, s) & mask
            continue
        if n <= 240:
            out[j] = _up_to_240(data, n, s) & mask
            continue
        blocks = (n - 1) // _BLOCK
        while folded < blocks:
            acc = _stripes(acc, w, folded * _BLOCK // 8, _STRIPES_PER_BLOCK, secret)
            acc = _scrambled(acc, secret)
            folded += 1
        tail = (n - blocks * _BLOCK - 1) // _STRIPE
        last = _stripes(acc, w, blocks * _BLOCK // 8, tail, secret)
        out[j] = _merged(_last_stripe(last, data, n, s), n, s) & mask
    return count


def warm_up() -> None:
    """Compile (first run on a machine) or load the kernel now, not at a first request,
    for the arrays callers pass: a read-only head (a view of the namespace's bytes) and
    a token array that is writable or read-only (a view of a cache's bytes)."""
    head = np.frombuffer(b"\0", dtype=np.uint8)
    for body in (np.zeros(1, np.uint32), np.frombuffer(bytes(4), dtype=np.uint32)):
        digests_at(head, body, np.zeros(1, np.int64), np.uint64(0), np.zeros(1, np.uint64))
