"""The one wire error, the value checks the message constructors run, and the map reader.

Every check names the field it rejects by its Python path (``events[3].tier``), never by
its short wire key, so an error reads the same whether a message was built in Python or
decoded from bytes. Constructors report paths relative to themselves; whoever builds a
nested value prefixes its own position with :meth:`WireError.within`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import BadInput

__all__ = [
    "I64_MAX",
    "MAX_STR_BYTES",
    "PARTITION_MAX",
    "U32_MAX",
    "U64_MAX",
    "Fields",
    "WireError",
    "bound",
    "build",
    "check_array",
    "check_bytes",
    "check_float",
    "check_int",
    "check_range",
    "check_str",
    "check_tuple",
    "kind_of",
    "set_int",
    "set_str",
]

U32_MAX: Final = (1 << 32) - 1
#: Kafka partitions are int32.
PARTITION_MAX: Final = (1 << 31) - 1
#: Counters, offsets, timestamps and generations: non-negative int64.
I64_MAX: Final = (1 << 63) - 1
U64_MAX: Final = (1 << 64) - 1
#: Longest UTF-8 string a message may carry (the decoder refuses longer ones).
MAX_STR_BYTES: Final = 1 << 20

P = ParamSpec("P")
T = TypeVar("T")

_POWERS: Final = {(1 << k) - 1: f"2^{k}-1" for k in (31, 32, 63, 64)}


class WireError(BadInput):
    """A message that is not valid on the wire: undecodable bytes or a bad field.

    A :class:`~kvcompass.errors.BadInput`: a consumer dead-letters the message with this
    text as the reason.

    ``field`` is the path of the offending value (``events[3].tier``), or ``None`` when
    the bytes as a whole are at fault (not msgpack, truncated, not a map, too large).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message if field is None else f"{field}: {message}")
        self.message = message
        self.field = field

    def within(self, prefix: str) -> WireError:
        """The same error, seen from the value that holds this one at ``prefix``."""
        if not prefix:
            return self
        return WireError(self.message, prefix if self.field is None else _join(prefix, self.field))

    def __reduce__(self) -> tuple[Any, ...]:
        return (WireError, (self.message, self.field))


def _join(prefix: str, name: str) -> str:
    if not prefix or name.startswith("["):
        return prefix + name
    return f"{prefix}.{name}"


def kind_of(value: object) -> str:
    """A value's type as an error message names it."""
    return "None" if value is None else type(value).__name__


def bound(n: int) -> str:
    return _POWERS.get(n, str(n))


def check_int(value: object, field: str, lo: int, hi: int) -> int:
    """``value`` if it is an int (not a bool) in ``lo..hi``."""
    if type(value) is int and lo <= value <= hi:  # the common case first
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise WireError(f"expected int, got {kind_of(value)}", field)
    number = int(value)
    if not lo <= number <= hi:
        raise WireError(f"expected {bound(lo)}..{bound(hi)}, got {number}", field)
    return number


def set_int(obj: object, name: str, lo: int, hi: int) -> int:
    """Check the int attribute ``name`` of a frozen dataclass and store it as an ``int``."""
    value = getattr(obj, name)
    if type(value) is int and lo <= value <= hi:  # already a plain int: nothing to store
        return value
    value = check_int(value, name, lo, hi)
    object.__setattr__(obj, name, value)
    return value


def check_float(value: object, field: str) -> float:
    """``value`` as a float if it is a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, float | int | np.floating | np.integer):
        raise WireError(f"expected float, got {kind_of(value)}", field)
    number = float(value)
    if not (math.isfinite(number) and number >= 0.0):
        raise WireError(f"expected a finite number ≥ 0, got {number}", field)
    return number


def check_str(value: object, field: str) -> str:
    """``value`` as an exact str if it is a non-empty str that UTF-8 encodes."""
    if type(value) is str and value.isascii() and 0 < len(value) <= MAX_STR_BYTES:
        return value  # the common case: ASCII encodes to as many bytes as characters
    if not isinstance(value, str):
        raise WireError(f"expected str, got {kind_of(value)}", field)
    value = str.__str__(value)  # a subclass (a StrEnum member, say) as a plain str
    if not value:
        raise WireError("expected a non-empty string", field)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise WireError("not encodable as UTF-8 (lone surrogate)", field) from None
    if size > MAX_STR_BYTES:
        raise WireError(f"string of {size} bytes exceeds {MAX_STR_BYTES}", field)
    return value


def set_str(obj: object, name: str) -> None:
    """Check the str attribute ``name`` of a frozen dataclass and store it as a ``str``."""
    object.__setattr__(obj, name, check_str(getattr(obj, name), name))


def check_bytes(value: object, field: str) -> bytes:
    """``value`` as exact bytes if it is bytes, a bytearray or a memoryview."""
    if type(value) is bytes:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise WireError(f"expected bytes, got {kind_of(value)}", field)


def check_tuple(value: object, field: str, limit: int | None = None) -> tuple[Any, ...]:
    """``value`` as a tuple if it is a tuple or list (of at most ``limit`` items)."""
    if not isinstance(value, tuple | list):
        raise WireError(f"expected a tuple, got {kind_of(value)}", field)
    if limit is not None and len(value) > limit:
        raise WireError(f"{len(value)} items exceed the limit of {limit}", field)
    return tuple(value)


def check_array(
    value: object, field: str, *, kinds: str, sizes: tuple[int, ...], shape: tuple[int, ...]
) -> NDArray[Any]:
    """``value`` if it is an ndarray of a dtype kind/size listed and of ``shape``.

    ``-1`` in ``shape`` accepts any length on that axis.
    """
    if not isinstance(value, np.ndarray):
        raise WireError(f"expected a numpy array, got {kind_of(value)}", field)
    dt = value.dtype
    if dt.kind not in kinds or dt.itemsize not in sizes:
        names = {"u": "uint", "i": "int"}
        want = " or ".join(f"{names[k]}{8 * s}" for k in kinds for s in sizes)
        raise WireError(f"expected {want} values, got dtype {dt}", field)
    if not _fits(value.shape, shape):
        dims = ["n" if w == -1 else str(w) for w in shape]
        want_shape = f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"
        raise WireError(f"expected shape {want_shape}, got {value.shape}", field)
    return value


def _fits(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether shape ``got`` is ``want``, where -1 in ``want`` is any length."""
    if got == want:
        return True
    if want == (-1,):  # the usual wildcard, without a loop
        return len(got) == 1
    return len(got) == len(want) and all(w in (-1, n) for w, n in zip(want, got, strict=True))


#: Up to this many elements, Python's min and max cost less than numpy's calls.
_SCALAR_RANGE = 32


def check_range(values: NDArray[Any], field: str, hi: int) -> None:
    """Every element of an integer array in ``0..hi``; names the first one that is not."""
    if len(values) == 0:
        return
    if len(values) <= _SCALAR_RANGE:
        listed = values.tolist()
        if min(listed) >= 0 and max(listed) <= hi:
            return
    elif int(values.min()) >= 0 and int(values.max()) <= hi:
        return
    bad = int(np.flatnonzero((values < 0) | (values > hi))[0])
    raise WireError(f"expected 0..{bound(hi)}, got {int(values[bad])}", f"{field}[{bad}]")


def build(path: str, factory: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``factory(...)``, with any WireError it raises re-rooted at ``path``."""
    try:
        return factory(*args, **kwargs)
    except WireError as exc:
        raise exc.within(path) from None


class Fields:
    """One decoded msgpack map at a known path, with typed getters for its fields.

    Getters take the short wire ``key`` and the Python ``name`` that errors report.
    They check presence and msgpack type only; the message constructors check ranges.
    Keys the reader never asks for are ignored (additive evolution).
    """

    __slots__ = ("_map", "path")

    def __init__(self, obj: object, path: str) -> None:
        if not isinstance(obj, dict):
            raise WireError(f"expected a map, got {kind_of(obj)}", path or None)
        self._map: dict[Any, Any] = obj
        self.path = path

    def name(self, name: str) -> str:
        return _join(self.path, name)

    def has(self, key: str) -> bool:
        return key in self._map

    def raw(self, key: str, name: str) -> object:
        try:
            return self._map[key]
        except KeyError:
            raise WireError(f"missing required field {key!r}", self.name(name)) from None

    def integer(self, key: str, name: str) -> int:
        value = self.raw(key, name)
        if type(value) is not int:
            raise WireError(f"expected int, got {kind_of(value)}", self.name(name))
        return value

    def text(self, key: str, name: str) -> str:
        value = self.raw(key, name)
        if type(value) is not str:
            raise WireError(f"expected str, got {kind_of(value)}", self.name(name))
        return value

    def blob(self, key: str, name: str) -> bytes:
        value = self.raw(key, name)
        if type(value) is not bytes:
            raise WireError(f"expected bytes, got {kind_of(value)}", self.name(name))
        return value

    def array(self, key: str, name: str, dtype: str | np.dtype[Any]) -> NDArray[Any]:
        """A packed little-endian array held in a bin field (a read-only view of it)."""
        data = self.blob(key, name)
        size = np.dtype(dtype).itemsize
        if len(data) % size:
            raise WireError(
                f"{len(data)} bytes is not a whole number of {size}-byte values", self.name(name)
            )
        return np.frombuffer(data, dtype=dtype)

    def submap(self, key: str, name: str) -> Fields:
        return Fields(self.raw(key, name), self.name(name))

    def maps(self, key: str, name: str) -> list[Fields]:
        """An array of maps, each reader at ``name[i]``."""
        items = self.raw(key, name)
        if type(items) is not list:
            raise WireError(f"expected an array, got {kind_of(items)}", self.name(name))
        return [Fields(item, f"{self.name(name)}[{i}]") for i, item in enumerate(items)]
