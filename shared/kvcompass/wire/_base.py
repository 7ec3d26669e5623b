"""The envelope every message shares, the msgpack settings, and the tag registry.

A message is one msgpack map: ``"t"`` its tag, ``"v"`` its ``[major, minor]`` schema
version, then its fields under short keys. A reader accepts any minor version of the
majors it knows (fields it does not know are ignored) and refuses a newer major.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, Final, Self, TypeVar, overload

import msgpack

from kvcompass.wire._checks import MAX_STR_BYTES, Fields, WireError, kind_of

__all__ = [
    "MAX_ITEMS",
    "MAX_MESSAGE_BYTES",
    "Buffer",
    "WireMessage",
    "pack_message",
    "register",
    "unpack_message",
]

#: Largest encoded message either side accepts (bounds the decoder's memory).
MAX_MESSAGE_BYTES: Final = 64 << 20
#: Most items in any msgpack array of a message (events of a batch, tables of a batch).
MAX_ITEMS: Final = 1 << 16
#: Most keys in any msgpack map (room for many fields added by later minor versions).
_MAX_MAP_KEYS: Final = 1 << 10

#: What the decoder reads from.
Buffer = bytes | bytearray | memoryview


def _no_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack extension type {code} is not part of the schema")


# Settings made once; every encode and decode uses exactly these. ``strict_types`` packs
# only exact builtins (lists, not tuples; no enums or numpy scalars sneak through).
_PACK_OPTIONS: Final = MappingProxyType(
    {"use_bin_type": True, "strict_types": True, "datetime": False, "use_single_float": False}
)
_UNPACK_OPTIONS: Final = MappingProxyType(
    {
        "raw": False,
        "strict_map_key": True,
        "use_list": True,
        "timestamp": 0,
        "ext_hook": _no_ext,
        "max_str_len": MAX_STR_BYTES,
        "max_bin_len": MAX_MESSAGE_BYTES,
        "max_array_len": MAX_ITEMS,
        "max_map_len": _MAX_MAP_KEYS,
        "max_ext_len": 0,
    }
)
# The exceptions msgpack's unpacker raises for bytes that are not one complete object
# within the limits above (FormatError, StackError and ExtraData are ValueErrors).
_UNPACK_FAILURES: Final = (ValueError, TypeError, OverflowError, msgpack.UnpackException)

M = TypeVar("M", bound="WireMessage")

_REGISTRY: dict[str, type[WireMessage]] = {}


class WireMessage:
    """Base of the top-level messages: a tag, a version, and the codec hooks."""

    __slots__ = ()

    #: Schema tag, the ``"t"`` of the envelope.
    TAG: ClassVar[str]
    #: Schema version this code writes; it reads every minor of this major.
    MAJOR: ClassVar[int]
    MINOR: ClassVar[int]

    def to_bytes(self) -> bytes:
        """This message encoded (same as ``kvcompass.wire.encode(self)``)."""
        return pack_message(self)

    @classmethod
    def from_bytes(cls, data: Buffer) -> Self:
        """Decode a message that must be of this type; raises :class:`WireError`."""
        return unpack_message(data, cls)

    def _body(self) -> dict[str, object]:
        """The fields under their wire keys (envelope excluded)."""
        raise NotImplementedError

    @classmethod
    def _from_body(cls, fields: Fields) -> Self:
        """Build the message from its decoded map (envelope already checked)."""
        raise NotImplementedError


def register(cls: type[M]) -> type[M]:
    """Class decorator: make ``cls`` decodable by its tag."""
    if cls.TAG in _REGISTRY:
        raise RuntimeError(f"wire tag {cls.TAG!r} registered twice")
    _REGISTRY[cls.TAG] = cls
    return cls


def pack_message(msg: WireMessage) -> bytes:
    """``msg`` as msgpack bytes; raises :class:`WireError` if it exceeds the size limit."""
    if _REGISTRY.get(getattr(msg, "TAG", "")) is not type(msg):
        raise TypeError(f"not a wire message: {kind_of(msg)}")
    body: dict[str, object] = {"t": msg.TAG, "v": [msg.MAJOR, msg.MINOR]}
    body.update(msg._body())
    data: bytes = msgpack.packb(body, **_PACK_OPTIONS)
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"encoded message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return data


@overload
def unpack_message(data: Buffer, expect: None = None) -> WireMessage: ...
@overload
def unpack_message(data: Buffer, expect: type[M]) -> M: ...
def unpack_message(data: Buffer, expect: type[WireMessage] | None = None) -> WireMessage:
    """Decode and validate one message; every failure is a :class:`WireError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"expected bytes, got {kind_of(data)}")
    size = memoryview(data).nbytes
    if size > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
    if size == 0:
        raise WireError("empty message")
    try:
        obj: Any = msgpack.unpackb(data, **_UNPACK_OPTIONS)
    except _UNPACK_FAILURES as exc:
        raise WireError(f"not a msgpack message: {exc or type(exc).__name__}") from exc
    if not isinstance(obj, dict):
        raise WireError(f"expected a map at the top level, got {kind_of(obj)}")
    top = Fields(obj, "")
    tag = top.text("t", "tag")
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise WireError(f"unknown message tag {tag!r}", "tag")
    if expect is not None and not issubclass(cls, expect):
        want = getattr(expect, "TAG", expect.__name__)
        raise WireError(f"expected a {want!r} message, got {tag!r}", "tag")
    _check_version(top, cls)
    return cls._from_body(top)


def _check_version(top: Fields, cls: type[WireMessage]) -> None:
    version = top.raw("v", "version")
    if (
        type(version) is not list
        or len(version) != 2
        or any(type(part) is not int for part in version)
    ):
        raise WireError(f"expected [major, minor] ints, got {version!r:.60}", "version")
    major, minor = version
    if major > cls.MAJOR:
        raise WireError(
            f"{cls.TAG!r} major version {major} is newer than this reader's {cls.MAJOR}",
            "version",
        )
    if major < cls.MAJOR or minor < 0:
        raise WireError(
            f"unsupported {cls.TAG!r} version {major}.{minor} (this reader: {cls.MAJOR}.x)",
            "version",
        )
