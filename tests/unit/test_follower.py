"""The edge's patch follower: every ordering, gap, epoch, duplicate and foreign case."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.errors import BadInput, InvariantBroken
from kvcompass.pipeline import Faults, FaultySource, PatchFollower, SnapshotCheck, Verdict
from kvcompass.snapshot import SnapshotMeta
from kvcompass.wire import PatchBatch

OWNER = "kvc-group/kvc:snap"
FOREIGN = "other-group/other:snap"


def meta(epoch: int, next_seq: int, *, shard: int = 0, owner: str = OWNER) -> SnapshotMeta:
    return SnapshotMeta(
        shard=shard,
        epoch=epoch,
        next_seq=next_seq,
        events_offset=-1,
        patches_offset=0,
        generations={},
        owner=owner,
    )


def batch(
    epoch: int, seq: int, *, shard: int = 0, owner: str = OWNER, produced_ns: int = 1
) -> PatchBatch:
    return PatchBatch(
        shard=shard,
        epoch=epoch,
        seq=seq,
        events_from=0,
        events_to=-1,
        produced_at_ns=produced_ns,
        owner=owner,
    )


def following(epoch: int = 2, next_seq: int = 5) -> PatchFollower:
    follower = PatchFollower(0)
    follower.loaded(meta(epoch, next_seq))
    return follower


# -- one batch at a time ------------------------------------------------------------------


def test_nothing_applies_before_a_snapshot_is_loaded() -> None:
    follower = PatchFollower(0)
    assert not follower.is_loaded
    assert follower.offer(batch(0, 0)) is Verdict.RESYNC


def test_the_next_batch_applies_and_advances_the_position() -> None:
    follower = following(2, 5)
    assert follower.offer(batch(2, 5)) is Verdict.APPLY
    follower.applied(batch(2, 5, produced_ns=77))
    assert follower.offer(batch(2, 6)) is Verdict.APPLY
    assert follower.position is not None
    assert (follower.position.epoch, follower.position.next_seq) == (2, 6)
    assert follower.last_produced_ns == 77


@pytest.mark.parametrize(
    ("epoch", "seq", "why"),
    [
        (2, 4, "the snapshot holds it"),
        (2, 0, "the epoch's first batch, long in the snapshot"),
        (1, 99, "an older epoch, however far its seq went"),
        (0, 0, "the first epoch"),
    ],
)
def test_batches_the_view_already_holds_are_skipped(epoch: int, seq: int, why: str) -> None:
    assert following(2, 5).offer(batch(epoch, seq)) is Verdict.SKIP, why


def test_a_redelivered_batch_is_skipped_after_it_applied() -> None:
    follower = following(2, 5)
    follower.applied(batch(2, 5))
    assert follower.offer(batch(2, 5)) is Verdict.SKIP


@pytest.mark.parametrize(
    ("epoch", "seq", "why"),
    [
        (2, 6, "a gap of one batch"),
        (2, 1000, "a long gap"),
        (3, 0, "a new epoch (another unit took the shard over)"),
        (3, 7, "a new epoch seen mid-stream"),
    ],
)
def test_a_batch_that_does_not_continue_the_view_resyncs(epoch: int, seq: int, why: str) -> None:
    assert following(2, 5).offer(batch(epoch, seq)) is Verdict.RESYNC, why


def test_reordered_batches_resync_once_and_then_apply_in_order() -> None:
    follower = following(2, 5)
    assert follower.offer(batch(2, 6)) is Verdict.RESYNC  # 6 overtook 5
    follower.loaded(meta(2, 5))  # the reload: the snapshot is still at 5
    for seq in (5, 6):
        assert follower.offer(batch(2, seq)) is Verdict.APPLY
        follower.applied(batch(2, seq))
    assert follower.offer(batch(2, 6)) is Verdict.SKIP  # the overtaking copy, re-read


def test_a_new_epoch_applies_after_its_snapshot_is_loaded() -> None:
    follower = following(2, 5)
    assert follower.offer(batch(3, 0)) is Verdict.RESYNC
    follower.loaded(meta(3, 0))
    assert follower.offer(batch(2, 5)) is Verdict.SKIP  # the old owner's tail
    assert follower.offer(batch(3, 0)) is Verdict.APPLY


@pytest.mark.parametrize(("epoch", "seq"), [(2, 5), (2, 6), (9, 0), (0, 0), (2, 4)])
def test_a_foreign_writers_batches_are_ignored_whatever_their_position(
    epoch: int, seq: int
) -> None:
    follower = following(2, 5)
    assert follower.offer(batch(epoch, seq, owner=FOREIGN)) is Verdict.IGNORE_FOREIGN
    assert follower.offer(batch(2, 5)) is Verdict.APPLY  # our writer's stream is intact


def test_interleaved_foreign_batches_never_cause_a_resync() -> None:
    follower = following(1, 0)
    verdicts = []
    for seq in range(50):
        for foreign in (batch(7, seq * 3, owner=FOREIGN), batch(0, 1000 + seq, owner=FOREIGN)):
            verdicts.append(follower.offer(foreign))
        assert follower.offer(batch(1, seq)) is Verdict.APPLY
        follower.applied(batch(1, seq))
    assert set(verdicts) == {Verdict.IGNORE_FOREIGN}


def test_an_empty_owner_is_an_owner_like_any_other() -> None:
    follower = PatchFollower(0)
    follower.loaded(meta(1, 0, owner=""))  # a snapshot written before owners existed
    assert follower.offer(batch(1, 0, owner="")) is Verdict.APPLY
    assert follower.offer(batch(1, 0)) is Verdict.IGNORE_FOREIGN


@pytest.mark.parametrize("shard", [1, 2, 4095])
def test_another_shards_batch_is_rejected(shard: int) -> None:
    follower = following(2, 5)
    assert follower.offer(batch(2, 5, shard=shard)) is Verdict.REJECT
    assert PatchFollower(0).offer(batch(0, 0, shard=shard)) is Verdict.REJECT


def test_applying_a_batch_that_was_not_next_breaks_an_invariant() -> None:
    follower = following(2, 5)
    for wrong in (batch(2, 6), batch(2, 4), batch(2, 5, owner=FOREIGN), batch(2, 5, shard=1)):
        with pytest.raises(InvariantBroken):
            follower.applied(wrong)
    with pytest.raises(InvariantBroken):
        PatchFollower(0).applied(batch(0, 0))
    assert follower.offer(batch(2, 5)) is Verdict.APPLY  # nothing changed


def test_another_shards_snapshot_is_refused() -> None:
    follower = following(2, 5)
    with pytest.raises(BadInput, match="shard 1"):
        follower.loaded(meta(9, 9, shard=1))
    assert follower.offer(batch(2, 5)) is Verdict.APPLY


def test_unload_makes_every_batch_resync() -> None:
    follower = following(2, 5)
    follower.unload()
    assert follower.offer(batch(2, 5)) is Verdict.RESYNC


def test_lag_is_the_age_of_the_newest_applied_batch() -> None:
    follower = following(2, 5)
    assert follower.lag_ns(10_000) == 0  # nothing applied since the load
    follower.applied(batch(2, 5, produced_ns=4_000))
    assert follower.lag_ns(10_000) == 6_000
    assert follower.lag_ns(3_000) == 0  # a clock behind the producer's: no negative lag
    follower.loaded(meta(3, 0))
    assert follower.lag_ns(10_000) == 0


# -- anti-entropy -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snapshot", "check"),
    [
        (meta(2, 5), SnapshotCheck.CURRENT),
        (meta(2, 3), SnapshotCheck.CURRENT),  # the view is ahead of it
        (meta(1, 90), SnapshotCheck.CURRENT),
        (meta(2, 6), SnapshotCheck.BEHIND),  # a lost final batch
        (meta(3, 0), SnapshotCheck.BEHIND),  # a takeover whose announcement was lost
        (meta(2, 5, owner=FOREIGN), SnapshotCheck.OWNER_CHANGED),
        (meta(0, 0, owner=FOREIGN), SnapshotCheck.OWNER_CHANGED),
    ],
)
def test_anti_entropy_reloads_only_a_snapshot_ahead_or_of_another_owner(
    snapshot: SnapshotMeta, check: SnapshotCheck
) -> None:
    assert following(2, 5).compare(snapshot) is check


def test_anti_entropy_reloads_an_unloaded_shard() -> None:
    assert PatchFollower(0).compare(meta(0, 0)) is SnapshotCheck.BEHIND


def test_after_an_owner_change_the_new_writer_is_followed_and_the_old_one_is_foreign() -> None:
    follower = following(2, 5)
    assert follower.compare(meta(1, 1, owner=FOREIGN)) is SnapshotCheck.OWNER_CHANGED
    follower.loaded(meta(1, 1, owner=FOREIGN))
    assert follower.offer(batch(1, 1, owner=FOREIGN)) is Verdict.APPLY
    assert follower.offer(batch(2, 5)) is Verdict.IGNORE_FOREIGN


# -- a whole stream, with faults ----------------------------------------------------------


@dataclass
class Shard:
    """One writer's shard: its patch log, snapshots and state (absolute writes by key)."""

    log: list[PatchBatch] = field(default_factory=list)
    effects: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    state: dict[int, int] = field(default_factory=dict)
    snapshots: list[tuple[SnapshotMeta, dict[int, int]]] = field(default_factory=list)
    epoch: int = 0
    next_seq: int = 0

    def take_over(self) -> None:
        self.epoch += 1
        self.next_seq = 0
        self.snapshot()
        self.publish(None)  # the epoch's announcement, like the MU's

    def publish(self, write: tuple[int, int] | None) -> None:
        if write is not None:
            self.state[write[0]] = write[1]
            self.effects[(self.epoch, self.next_seq)] = write
        self.log.append(batch(self.epoch, self.next_seq))
        self.next_seq += 1

    def snapshot(self) -> None:
        m = SnapshotMeta(
            shard=0,
            epoch=self.epoch,
            next_seq=self.next_seq,
            events_offset=-1,
            patches_offset=len(self.log),
            generations={},
            owner=OWNER,
        )
        self.snapshots.append((m, dict(self.state)))


class Edge:
    """The replayer's loop over one partition, minus Kafka: follow, resync, anti-entropy."""

    def __init__(self, shard: Shard, faults: Faults, seed: int) -> None:
        self.shard = shard
        self.follower = PatchFollower(0)
        self.view: dict[int, int] = {}
        self.offset = 0
        self.resyncs = 0
        self.source = FaultySource(self._read, faults, seed=seed)
        self.reload()

    def _read(self) -> list[PatchBatch]:
        out = self.shard.log[self.offset : self.offset + 4]
        self.offset += len(out)
        return out

    def reload(self) -> None:
        snapshot, state = self.shard.snapshots[-1]
        self.view = dict(state)
        self.follower.loaded(snapshot)
        self.offset = snapshot.patches_offset

    def step(self) -> bool:
        """One poll; False once idle."""
        messages = self.source()
        for message in messages:
            verdict = self.follower.offer(message)
            if verdict is Verdict.APPLY:
                write = self.shard.effects.get((message.epoch, message.seq))
                if write is not None:
                    self.view[write[0]] = write[1]
                self.follower.applied(message)
            elif verdict is Verdict.RESYNC:
                self.resyncs += 1
                self.reload()
                break
            else:
                assert verdict is Verdict.SKIP
        if messages:
            return True
        if self.follower.compare(self.shard.snapshots[-1][0]) is not SnapshotCheck.CURRENT:
            self.reload()
            return True
        return False


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    drop=st.sampled_from([0.0, 0.05, 0.2]),
    duplicate=st.sampled_from([0.0, 0.1, 0.3]),
    reorder=st.sampled_from([0.0, 0.05, 0.2]),
    delay=st.sampled_from([0.0, 0.1]),
    takeovers=st.lists(st.integers(0, 60), max_size=4),
    snapshot_every=st.integers(3, 20),
)
def test_a_faulty_stream_converges_to_the_writers_state(
    seed: int,
    drop: float,
    duplicate: float,
    reorder: float,
    delay: float,
    takeovers: list[int],
    snapshot_every: int,
) -> None:
    shard = Shard()
    shard.take_over()
    faults = Faults(drop=drop, duplicate=duplicate, reorder=reorder, delay=delay)
    edge = Edge(shard, faults, seed)
    for i in range(60):
        if i in takeovers:
            shard.take_over()
        shard.publish((i % 9, i))
        if i % snapshot_every == 0:
            shard.snapshot()
        edge.step()  # the edge reads while the writer writes
    shard.snapshot()  # the writer's final snapshot (a drain)
    for _ in range(10_000):
        if not edge.step():
            break
    assert edge.view == shard.state
    assert edge.follower.position is not None
    assert (edge.follower.position.epoch, edge.follower.position.next_seq) == (
        shard.epoch,
        shard.next_seq,
    )
    if drop == duplicate == reorder == delay == 0.0:
        assert edge.resyncs <= len(set(takeovers))  # only takeovers reload a clean stream
