"""Reading what a shard's patch partition already holds, for fencing a takeover.

The epoch a new writer picks must be above every epoch this owner ever published, and
the patch stream remembers them even when Redis lost every snapshot. So a takeover reads
the partition from the last snapshot's position (or from its start when the snapshot is
lost) to its end. The embedded broker under-reports a partition's end when its last
record batch holds several records (research/infra.md), so "the end" is: past the
reported high watermark, and then nothing more for a quiet period.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kvcompass.errors import Transient
from kvcompass.wire import PatchBatch, WireError, decode

__all__ = ["StreamTail", "read_tail"]


@dataclass(frozen=True, slots=True)
class StreamTail:
    """What the partition holds from where reading started."""

    #: Highest epoch of this owner's batches (None: no batch of this owner).
    epoch: int | None
    #: Offset after the last record read (where the next batch will land, at least).
    end: int
    #: Batches of other owners seen (another group writes this topic: a misconfiguration).
    foreign: int
    #: Records that were not patch batches at all.
    undecodable: int
    #: The start lay past the partition's end: not the log it was taken from (a memory
    #: broker restarted empty), so the partition was read from its beginning instead.
    restarted: bool = False


def read_tail(
    consumer: Consumer,
    topic: str,
    partition: int,
    start: int,
    owner: str,
    *,
    quiet_s: float,
    timeout_s: float,
) -> StreamTail:
    """Read ``topic``/``partition`` from ``start`` to its end (``consumer`` is assigned
    to it for the call). Raises :class:`Transient` when the broker does not answer."""
    tp = TopicPartition(topic, partition)
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
    except KafkaException as exc:
        raise Transient(f"broker did not report {topic}[{partition}]'s offsets: {exc}") from exc
    restarted = start > high
    position = low if restarted else max(start, low)
    epoch: int | None = None
    foreign = undecodable = 0
    consumer.assign([TopicPartition(topic, partition, position)])
    deadline = time.monotonic() + timeout_s
    quiet_until = time.monotonic() + quiet_s
    try:
        while position < high or time.monotonic() < quiet_until:
            if time.monotonic() > deadline:
                raise Transient(
                    f"reading {topic}[{partition}] from {start} did not reach its end "
                    f"({high}) within {timeout_s:g} s"
                )
            for message in consumer.consume(500, quiet_s / 4):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise Transient(f"reading {topic}[{partition}]: {error}")
                    continue
                offset = message.offset()
                if offset is None:
                    continue
                position = max(position, offset + 1)
                quiet_until = time.monotonic() + quiet_s
                try:
                    batch = decode(message.value() or b"", PatchBatch)
                except WireError:
                    undecodable += 1
                    continue
                if batch.owner == owner:
                    epoch = batch.epoch if epoch is None else max(epoch, batch.epoch)
                else:
                    foreign += 1
    finally:
        consumer.unassign()
    return StreamTail(epoch, position, foreign, undecodable, restarted)
