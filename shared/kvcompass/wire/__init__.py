"""The KVCompass wire schema: versioned msgpack messages, validated when decoded.

Every message is one msgpack map ``{"t": tag, "v": [major, minor], ...fields}`` under
short keys, documented in each dataclass's docstring. Bulk data (keys, bucket images,
queue estimates) travels as packed little-endian arrays in bin fields.

Evolution is additive. A new field is optional and bumps the minor version; readers
ignore fields they do not know, so a reader accepts every minor version of its major.
Anything else (a renamed, retyped or removed field, a changed meaning) bumps the major
version, which older readers refuse.

:func:`decode` raises one error type, :class:`WireError` (a
:class:`kvcompass.errors.BadInput`, so also a ``ValueError``), for every
invalid input, naming the offending field's path (``events[3].tier: expected 0..2,
got 7``). The constructors run the same checks, so an invalid message can be neither
built nor decoded. Nothing here performs I/O.
"""

from kvcompass.wire._base import MAX_ITEMS, MAX_MESSAGE_BYTES, Buffer, WireMessage
from kvcompass.wire._checks import WireError
from kvcompass.wire._codec import Message, decode, encode
from kvcompass.wire._dead_letter import DeadLetter
from kvcompass.wire._event import EventKind, KVEvent
from kvcompass.wire._events import KVEventBatch
from kvcompass.wire._patches import PatchBatch, TablePatchWire, TableReload
from kvcompass.wire._queues import QueueVector

__all__ = [
    "MAX_ITEMS",
    "MAX_MESSAGE_BYTES",
    "Buffer",
    "DeadLetter",
    "EventKind",
    "KVEvent",
    "KVEventBatch",
    "Message",
    "PatchBatch",
    "QueueVector",
    "TablePatchWire",
    "TableReload",
    "WireError",
    "WireMessage",
    "decode",
    "encode",
]
