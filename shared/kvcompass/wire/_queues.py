"""Queue vectors: a region's per-worker queue estimates, broadcast on ``kvc.queues``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

import numpy as np

from kvcompass.wire._base import WireMessage, register
from kvcompass.wire._checks import (
    I64_MAX,
    U32_MAX,
    Fields,
    WireError,
    check_float,
    check_int,
    check_tuple,
    kind_of,
    set_int,
    set_str,
)

__all__ = ["QueueVector"]

_INDEX: Final = np.dtype("<u4")
_MS: Final = np.dtype("<f8")


def _queues(value: object) -> tuple[tuple[int, float], ...]:
    out = []
    seen: dict[int, int] = {}
    for i, pair in enumerate(check_tuple(value, "queues")):
        field = f"queues[{i}]"
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise WireError(f"expected a (worker_index, queue_ms) pair, got {kind_of(pair)}", field)
        worker = check_int(pair[0], f"{field}.worker_index", 0, U32_MAX)
        if worker in seen:
            raise WireError(f"worker {worker} already at queues[{seen[worker]}]", field)
        seen[worker] = i
        out.append((worker, check_float(pair[1], f"{field}.queue_ms")))
    return tuple(out)


@register
@dataclass(frozen=True, slots=True)
class QueueVector(WireMessage):
    """Queue estimates of some workers of ``region`` (each worker at most once).

    ``queues`` holds (worker_index, queue_ms) pairs: the worker's index in the topology
    and its expected queueing delay in milliseconds (finite, ≥ 0). ``seq`` increases per
    vector the region sends; ``sent_at_ns`` is the sender's wall clock. ``to`` names the
    regions whose edges should apply it (empty: all): one topic carries every region's
    broadcast, and a sender leaves out the regions that a piggybacked vector on a
    response reached within the broadcast period (paper §3.4).

    Wire map, tag ``"queue_vector"``, version 1.0:

    ====  ==========  ======================================================
    key   field       encoding
    ====  ==========  ======================================================
    r     region      str, non-empty
    ts    sent_at_ns  int 0..2^63-1 (ns since the Unix epoch)
    q     seq         int 0..2^63-1
    wi    queues      bin: every pair's worker_index, uint32 LE
    qm    queues      bin: every pair's queue_ms, float64 LE (same count)
    to    to          array of str, optional (absent: all regions; since 1.1)
    ====  ==========  ======================================================
    """

    TAG: ClassVar[str] = "queue_vector"
    MAJOR: ClassVar[int] = 1
    MINOR: ClassVar[int] = 1

    region: str
    sent_at_ns: int
    seq: int
    queues: tuple[tuple[int, float], ...] = ()
    to: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        set_str(self, "region")
        set_int(self, "sent_at_ns", 0, I64_MAX)
        set_int(self, "seq", 0, I64_MAX)
        object.__setattr__(self, "queues", _queues(self.queues))
        object.__setattr__(self, "to", _regions(self.to))

    def addressed_to(self, region: str) -> bool:
        return not self.to or region in self.to

    def _body(self) -> dict[str, object]:
        return {
            "r": self.region,
            "ts": self.sent_at_ns,
            "q": self.seq,
            "wi": np.array([w for w, _ in self.queues], dtype=_INDEX).tobytes(),
            "qm": np.array([ms for _, ms in self.queues], dtype=_MS).tobytes(),
            **({"to": list(self.to)} if self.to else {}),
        }

    @classmethod
    def _from_body(cls, f: Fields) -> QueueVector:
        workers = f.array("wi", "queues", "<u4")
        queue_ms = f.array("qm", "queues", "<f8")
        if len(workers) != len(queue_ms):
            raise WireError(
                f"{len(workers)} worker indices but {len(queue_ms)} queue times", f.name("queues")
            )
        return cls(
            region=f.text("r", "region"),
            sent_at_ns=f.integer("ts", "sent_at_ns"),
            seq=f.integer("q", "seq"),
            queues=tuple(zip(workers.tolist(), queue_ms.tolist(), strict=True)),
            to=_regions(f.raw("to", "to")) if f.has("to") else (),
        )


def _regions(value: object) -> tuple[str, ...]:
    out = []
    for i, name in enumerate(check_tuple(value, "to")):
        if type(name) is not str or not name:
            raise WireError(f"expected a non-empty str, got {kind_of(name)}", f"to[{i}]")
        out.append(name)
    return tuple(out)
