"""Which event batches a shard applies: every worker's batches once, in their log order.

Kafka delivers at least once, so a maintenance unit sees a worker's batch again after a
crash or a rebalance. Each batch names its worker's *incarnation* (a random number per
worker run) and its sequence number in that run, counted from 0. Per worker this keeps
the current incarnation's last applied number and a few retired incarnations':

- a batch at or below the last number of its incarnation is a redelivery (dropped);
- a number more than ``max_seq_jump`` above the last is refused (the batch is
  dead-lettered with the reason): applying it would make every later, ordinary batch of
  that worker look like a redelivery, silently and for good;
- a new incarnation is that worker's restart: it becomes current and its numbering
  starts over; the one it replaces is retired, so a redelivery of it is still dropped;
- a batch of a retired incarnation above that incarnation's last number is refused (the
  old run is over; applying it now would reorder the worker's changes).

Decisions depend only on the batches seen, in log order, so replaying the log from a
snapshot of this table makes the same decisions again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from kvcompass.errors import BadInput

__all__ = ["Admission", "SequenceRefused", "WorkerSequences"]

#: Retired incarnations remembered per worker (restarts whose batches may still be
#: redelivered: a worker rarely restarts several times within one snapshot interval).
RETIRED_KEPT = 4


class Admission(Enum):
    """What to do with a batch."""

    APPLY = "apply"  # the next batch of the worker's current incarnation (or its first)
    RESTART = "restart"  # apply: the first batch of a new incarnation of a known worker
    DUPLICATE = "duplicate"  # drop: its incarnation already applied this number


#: Members read per batch: through their class each read costs ~40 ns (EnumType's
#: ``__getattr__`` hook slows every attribute lookup on an enum class).
_APPLY, _RESTART, _DUPLICATE = Admission.APPLY, Admission.RESTART, Admission.DUPLICATE


class SequenceRefused(BadInput):
    """A batch whose sequence number cannot be applied in order (dead-lettered)."""


@dataclass(slots=True)
class _Worker:
    incarnation: int
    last: int
    #: older incarnation -> its last applied number; oldest first
    retired: dict[int, int] = field(default_factory=dict)


class WorkerSequences:
    """The last applied sequence number of every worker's incarnations, for one shard."""

    def __init__(self, max_seq_jump: int) -> None:
        if max_seq_jump < 1:
            raise ValueError(f"max_seq_jump must be at least 1, got {max_seq_jump}")
        self.max_seq_jump = max_seq_jump
        self._workers: dict[str, _Worker] = {}

    def admit(self, worker_id: str, incarnation: int, seq: int) -> Admission:
        """The decision for a batch; changes nothing (call :meth:`record` once applied).

        Raises :class:`SequenceRefused` naming the numbers when it must not be applied.
        """
        known = self._workers.get(worker_id)
        if known is None:
            self._check_jump(worker_id, incarnation, -1, seq)
            return _APPLY
        if incarnation == known.incarnation:  # the common case: the worker's next batch
            last = known.last
            if seq <= last:
                return _DUPLICATE
            self._check_jump(worker_id, incarnation, last, seq)
            return _APPLY
        retired_last = known.retired.get(incarnation)
        if retired_last is not None:
            if seq <= retired_last:
                return Admission.DUPLICATE
            raise SequenceRefused(
                f"worker {worker_id!r} incarnation {incarnation} seq {seq}: that incarnation "
                f"was superseded by {known.incarnation} after seq {retired_last}"
            )
        self._check_jump(worker_id, incarnation, -1, seq)
        return Admission.RESTART

    def _check_jump(self, worker_id: str, incarnation: int, last: int, seq: int) -> None:
        if seq > last + self.max_seq_jump:
            raise SequenceRefused(
                f"worker {worker_id!r} incarnation {incarnation} seq {seq} jumps more than "
                f"{self.max_seq_jump} past {'its start' if last < 0 else f'seq {last}'}"
            )

    def record(self, worker_id: str, incarnation: int, seq: int) -> None:
        """Note a batch applied after :meth:`admit` said APPLY or RESTART."""
        known = self._workers.get(worker_id)
        if known is None:
            self._workers[worker_id] = _Worker(incarnation, seq)
            return
        if incarnation != known.incarnation:
            known.retired.pop(incarnation, None)
            known.retired[known.incarnation] = known.last
            while len(known.retired) > RETIRED_KEPT:
                del known.retired[next(iter(known.retired))]
            known.incarnation = incarnation
        known.last = seq

    def current(self, worker_id: str) -> tuple[int, int] | None:
        """(incarnation, last applied seq) of the worker, None when never seen."""
        known = self._workers.get(worker_id)
        return None if known is None else (known.incarnation, known.last)

    def __len__(self) -> int:
        return len(self._workers)

    # -- persistence -------------------------------------------------------------------

    def to_map(self) -> dict[str, int]:
        """Everything as a flat map (``SnapshotMeta.worker_seq``).

        Key ``"<worker>@<rank>@<incarnation>"``, value its last applied seq; rank 0 is the
        current incarnation, 1.. the retired ones, most recent first.
        """
        out: dict[str, int] = {}
        for worker_id, known in sorted(self._workers.items()):
            out[f"{worker_id}@0@{known.incarnation}"] = known.last
            for rank, (incarnation, last) in enumerate(reversed(known.retired.items()), 1):
                out[f"{worker_id}@{rank}@{incarnation}"] = last
        return out

    @classmethod
    def from_map(cls, entries: Mapping[str, int], max_seq_jump: int) -> WorkerSequences:
        """The table :meth:`to_map` wrote; BadInput for an entry it cannot have written."""
        ranked: dict[str, dict[int, tuple[int, int]]] = {}
        for key, last in entries.items():
            parts = key.rsplit("@", 2)
            if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()) or last < 0:
                raise BadInput(f"worker sequence entry {key!r}={last} is not <worker>@<n>@<n>")
            worker_id, rank, incarnation = parts[0], int(parts[1]), int(parts[2])
            ranked.setdefault(worker_id, {})[rank] = (incarnation, last)
        table = cls(max_seq_jump)
        for worker_id, by_rank in ranked.items():
            if sorted(by_rank) != list(range(len(by_rank))) or len(by_rank) > RETIRED_KEPT + 1:
                raise BadInput(f"worker {worker_id!r} has incarnation ranks {sorted(by_rank)}")
            incarnation, last = by_rank[0]
            retired = {by_rank[r][0]: by_rank[r][1] for r in range(len(by_rank) - 1, 0, -1)}
            table._workers[worker_id] = _Worker(incarnation, last, retired)
        return table
