"""Dead letters: a message a consumer could not process, parked on the DLQ topic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvcompass.wire._base import WireMessage, register
from kvcompass.wire._checks import I64_MAX, PARTITION_MAX, Fields, check_bytes, set_int, set_str

__all__ = ["DeadLetter"]


@register
@dataclass(frozen=True, slots=True)
class DeadLetter(WireMessage):
    """A record a consumer gave up on, with where it came from and why.

    ``payload`` is the original record value, byte for byte (so it can be replayed once
    the cause is fixed); ``reason`` says why it was refused (for a decode failure, the
    :class:`WireError` text). Any bytes-like payload is stored as ``bytes``.

    Wire map, tag ``"dead_letter"``, version 1.0:

    ====  =========  =============================
    key   field      encoding
    ====  =========  =============================
    tp    topic      str, non-empty
    pt    partition  int 0..2^31-1
    of    offset     int 0..2^63-1
    rs    reason     str, non-empty
    pl    payload    bin
    ====  =========  =============================
    """

    TAG: ClassVar[str] = "dead_letter"
    MAJOR: ClassVar[int] = 1
    MINOR: ClassVar[int] = 0

    topic: str
    partition: int
    offset: int
    reason: str
    payload: bytes

    def __post_init__(self) -> None:
        set_str(self, "topic")
        set_int(self, "partition", 0, PARTITION_MAX)
        set_int(self, "offset", 0, I64_MAX)
        set_str(self, "reason")
        object.__setattr__(self, "payload", check_bytes(self.payload, "payload"))

    def _body(self) -> dict[str, object]:
        return {
            "tp": self.topic,
            "pt": self.partition,
            "of": self.offset,
            "rs": self.reason,
            "pl": self.payload,
        }

    @classmethod
    def _from_body(cls, f: Fields) -> DeadLetter:
        return cls(
            topic=f.text("tp", "topic"),
            partition=f.integer("pt", "partition"),
            offset=f.integer("of", "offset"),
            reason=f.text("rs", "reason"),
            payload=f.blob("pl", "payload"),
        )
