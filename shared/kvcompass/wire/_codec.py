"""``encode`` and ``decode`` over the union of all top-level messages."""

from __future__ import annotations

from typing import TypeVar, overload

from kvcompass.wire._base import Buffer, WireMessage, pack_message, unpack_message
from kvcompass.wire._dead_letter import DeadLetter
from kvcompass.wire._events import KVEventBatch
from kvcompass.wire._patches import PatchBatch
from kvcompass.wire._queues import QueueVector

__all__ = ["Message", "decode", "encode"]

#: Every top-level message type.
Message = KVEventBatch | PatchBatch | QueueVector | DeadLetter

M = TypeVar("M", bound=WireMessage)


def encode(msg: Message) -> bytes:
    """``msg`` as msgpack bytes (a map: tag, version, fields)."""
    return pack_message(msg)


@overload
def decode(data: Buffer, expect: None = None) -> Message: ...
@overload
def decode(data: Buffer, expect: type[M]) -> M: ...
def decode(data: Buffer, expect: type[WireMessage] | None = None) -> WireMessage:
    """Decode and validate one message, of type ``expect`` when given.

    Raises :class:`WireError` (and nothing else) for anything that is not a valid
    message: bytes that are not msgpack or are truncated, a top level that is not a map,
    an unknown tag, a newer major version, another type than ``expect``, or a field that
    is missing, of the wrong type or out of range. Unknown fields are ignored.
    """
    return unpack_message(data, expect)
