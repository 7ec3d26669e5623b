"""Shared-memory views: a reader in another process sees exactly the writer's state, and
never a dead writer's state as ready."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import pickle
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcompass.errors import BadInput, ConfigError, Transient
from kvcompass.index import LudoTable, SnapshotError, TablePatch, probe_call
from kvcompass.index.discovery import DiscoveryView, Match, MultiLevelQuery, QueryPlanner
from kvcompass.index.layout import IndexLayout, Tier, with_tier
from kvcompass.index.reader import IndexNotReady, IndexReader
from kvcompass.keys import Namespace, prefix_keys, shard_of
from kvcompass.levels import plan_levels
from kvcompass.loadgen.testing import poll_until
from kvcompass.shm import (
    SHM_DIR,
    PrefixInUse,
    SharedIndexReader,
    SharedIndexWriter,
    TornRead,
    remove_segments,
    segments,
)
from kvcompass.shm import writer as shm_writer
from kvcompass.topology import Topology, load_builtin

NS = Namespace("shm-test-model")
WRITER_SCRIPT = Path(__file__).with_name("_shm_writer.py")


@pytest.fixture
def prefix() -> Iterator[str]:
    """A fresh prefix; every writer of it must have cleaned up after itself."""
    name = f"kvct{uuid.uuid4().hex[:10]}"
    yield name
    assert not [p.name for p in SHM_DIR.iterdir() if p.name.startswith(name)]


def _reader_answers(prefix: str, keys: list[int], out: mp.Queue) -> None:  # type: ignore[type-arg]
    reader = SharedIndexReader(prefix)
    try:
        out.put([reader.lookup(0, 0, k) for k in keys])
    finally:
        reader.close()


def _answers_in_child(prefix: str, keys: list[int]) -> list[int]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_reader_answers, args=(prefix, keys, out))
    proc.start()
    try:
        answers: list[int] = out.get(timeout=60)
    finally:
        proc.join(timeout=60)
    assert proc.exitcode == 0
    return answers


def test_reader_follows_patches_growth_and_othello_resets(prefix: str) -> None:
    rng = random.Random(5)
    table = LudoTable.with_capacity(64, rng=rng)
    writer = SharedIndexWriter(prefix, n_shards=1, n_tables=1)
    try:
        writer.load_table(0, 0, table.view_image())
        reference: dict[int, int] = {}
        generations = {table.geometry.generation}
        resets = 0
        for step in range(600):
            key = rng.getrandbits(63)
            reference[key] = step % 7 + 1
            patch = table.put(key, reference[key])
            if patch.reload is not None:
                writer.load_table(0, 0, patch.reload)
            else:
                resets += patch.othello_reset is not None
                writer.apply(0, {0: patch})
            generations.add(table.geometry.generation)
        writer.set_position(0, seq=600, epoch=1)
        assert len(generations) > 1, "the table should have grown at least once"
        assert resets > 0, "at least one Othello rebuild should have happened"
        keys = list(reference)
        assert _answers_in_child(prefix, keys) == [reference[k] for k in keys]
        reader = SharedIndexReader(prefix)
        try:
            assert reader.ready()
            assert reader.position(0) == (600, 1, True)
            assert [reader.lookup(0, 0, k) for k in keys] == [reference[k] for k in keys]
        finally:
            reader.close()
    finally:
        writer.close()


def test_reader_refuses_missing_half_made_and_foreign_segments(prefix: str) -> None:
    with pytest.raises(FileNotFoundError):
        SharedIndexReader(prefix)
    writer = SharedIndexWriter(prefix, 1, 1)
    try:
        header = writer._ctl.buf  # the control segment's first bytes: the header
        saved = bytes(header[:16])
        # Zeroed: a writer between creating the segment and writing its header.
        header[:16] = bytes(16)
        with pytest.raises(FileNotFoundError, match="being initialised"):
            SharedIndexReader(prefix)
        header[:8] = b"NOTKVCMP"
        with pytest.raises(SnapshotError, match="not a KVCompass control segment"):
            SharedIndexReader(prefix)
        header[:16] = saved
        SharedIndexReader(prefix).close()
    finally:
        writer.close()


def _read_stable_keys(
    prefix: str,
    expected: dict[int, int],
    started: Any,
    done: Any,
    out: Any,
) -> None:
    reader = SharedIndexReader(prefix)
    wrong = reads = 0
    try:
        started.set()
        while not done.is_set() or reads == 0:
            for key, value in expected.items():
                reads += 1
                if reader.lookup(0, 0, key) != value:
                    wrong += 1
        out.put((reads, wrong))
    finally:
        reader.close()


def test_concurrent_reader_never_sees_a_torn_state(prefix: str) -> None:
    """A reader in another process keeps reading stable keys right while churn moves
    them between buckets, re-seeds their buckets, flips Othello bits and grows the
    table. (Races are rare in CPython, so this guards against regressions rather than
    proving the sequence lock necessary.)"""
    rng = random.Random(9)
    table = LudoTable.with_capacity(2000, fingerprint_bits=8, rng=rng)
    stable = {rng.getrandbits(63): rng.randrange(1, 1 << 32) for _ in range(1500)}
    writer = SharedIndexWriter(prefix, n_shards=1, n_tables=1)
    try:
        writer.load_table(0, 0, table.view_image())
        writer.apply(0, {0: table.put_many(list(stable), list(stable.values()))})
        ctx = mp.get_context("spawn")
        started, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_read_stable_keys, args=(prefix, stable, started, done, out))
        proc.start()
        try:
            deadline = time.monotonic() + 120
            while not started.wait(0.05):
                assert proc.is_alive(), f"reader exited early with {proc.exitcode}"
                assert time.monotonic() < deadline, "reader did not start"
            churn: list[int] = []
            generations = {table.geometry.generation}
            for step in range(3000):
                if churn and step % 3 == 2:
                    patch = table.remove(churn.pop(rng.randrange(len(churn))))
                else:
                    churn.append(rng.getrandbits(63))
                    patch = table.put(churn[-1], 7)
                if patch.reload is not None:
                    writer.load_table(0, 0, patch.reload)
                else:
                    writer.apply(0, {0: patch})
                generations.add(table.geometry.generation)
            done.set()
            reads, wrong = out.get(timeout=60)
        finally:
            done.set()
            proc.join(timeout=60)
        assert proc.exitcode == 0
        assert len(generations) > 1, "the churn should have grown the table"
        assert reads > len(stable)
        assert wrong == 0
    finally:
        writer.close()


# -- the IndexReader over shared memory ---------------------------------------------------


def topology_with(name: str, value_bits: int | None = None) -> Topology:
    """A built-in topology with 16-bit fingerprints (exact answers), and optionally
    narrower values, so that one region spans several tables."""
    topology = load_builtin(name)
    index = replace(topology.index, fingerprint_bits=16)
    if value_bits is not None:
        index = replace(index, value_bits=value_bits)
    return replace(topology, index=index)


@dataclass
class Tables:
    """Every shard's full-key tables of a layout, written directly (the MU's part)."""

    topology: Topology
    layout: IndexLayout
    n_shards: int
    tables: dict[tuple[int, int], LudoTable]

    @classmethod
    def empty(cls, topology: Topology, n_shards: int, capacity: int, seed: int = 1) -> Tables:
        layout = IndexLayout.from_topology(topology)
        rng = random.Random(seed)
        tables = {
            (shard, spec.table_id): LudoTable.with_capacity(
                capacity,
                value_bits=spec.value_bits,
                fingerprint_bits=layout.fingerprint_bits,
                rng=rng,
            )
            for shard in range(n_shards)
            for spec in layout.tables
        }
        return cls(topology, layout, n_shards, tables)

    def register(
        self, worker: int, tokens: np.ndarray, tier: Tier, up_to: int = 1 << 30
    ) -> dict[tuple[int, int], TablePatch]:
        """``worker`` holds ``tokens``' prefixes up to ``up_to`` tokens in ``tier``."""
        region = self.topology.workers[worker].region
        lengths = [c for c in plan_levels(self.topology).registration_lengths[region] if c <= up_to]
        table_id, field = self.layout.slots[worker]
        touched = set()
        for key in prefix_keys(tokens, lengths, NS).values():
            where = (shard_of(key, self.n_shards), table_id)
            table = self.tables[where]
            table.write(key, with_tier(table.get(key), field, tier))
            touched.add(where)
        return {where: self.tables[where].take_patch() for where in touched}

    def images(self) -> dict[tuple[int, int], bytes]:
        return {where: table.view_image() for where, table in self.tables.items()}


def feed(writer: SharedIndexWriter, patches: dict[tuple[int, int], TablePatch]) -> None:
    """Hand a batch of table patches to the writer as the edge replayer does."""
    batches: dict[int, dict[int, TablePatch]] = {}
    for (shard, table), patch in patches.items():
        if patch.reload is not None:
            writer.load_table(shard, table, patch.reload)
        else:
            batches.setdefault(shard, {})[table] = patch
    for shard, batch in batches.items():
        writer.apply(shard, batch)


def start_writer(
    prefix: str, n_shards: int, n_tables: int, images: dict[tuple[int, int], bytes]
) -> SharedIndexWriter:
    writer = SharedIndexWriter(prefix, n_shards, n_tables)
    for (shard, table), image in images.items():
        writer.load_table(shard, table, image)
    for shard in range(n_shards):
        writer.set_position(shard, seq=1, epoch=1)
    return writer


def answers(reader: IndexReader, queries: list[MultiLevelQuery]) -> list[Match]:
    return [reader.match(q) for q in queries]


@pytest.mark.parametrize(
    ("topology_name", "value_bits", "n_shards"),
    [("testbed-3region", None, 3), ("sim-16region", 32, 2)],
)
def test_match_through_shared_memory_equals_the_in_process_view(
    prefix: str, topology_name: str, value_bits: int | None, n_shards: int
) -> None:
    """Registrations, tier changes and evictions, through table growth: the shared-memory
    reader answers every edge's queries exactly as the in-process view and a reference,
    and their chained versions (``MultiLevelQuery.chained``, with the planner's guard
    rows) as the view."""
    topology = topology_with(topology_name, value_bits)
    tables = Tables.empty(topology, n_shards, capacity=1)
    layout, plan = tables.layout, plan_levels(topology)
    if value_bits is not None:
        assert len(layout.tables) > len(topology.regions), "a region should span two tables"
    view = DiscoveryView.from_images(layout, n_shards, tables.images())
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 128_000, 7000, dtype=np.uint32) for _ in range(4)]
    held: dict[tuple[int, int], Tier] = {}  # (worker, key) -> tier: the reference
    edges = [r.name for r in topology.regions[:3]]
    queries = [MultiLevelQuery.for_prompt(p, e, plan, NS) for p in prompts for e in edges]
    chained = [
        MultiLevelQuery.for_prompt(p, e, plan, NS, chained=True) for p in prompts for e in edges
    ]
    assert any(QueryPlanner(plan, e, NS, chained=True).guard_lengths for e in edges)
    with (
        SharedIndexWriter(prefix, n_shards, len(layout.tables)) as writer,
        SharedIndexReader(prefix, layout) as reader,
    ):
        for (shard, table), image in tables.images().items():
            writer.load_table(shard, table, image)
        for shard in range(n_shards):
            writer.set_position(shard, seq=0, epoch=1)
        found = found_chained = 0
        for step in range(32):
            worker = int(rng.integers(len(topology.workers)))
            tokens = prompts[step % len(prompts)]
            tier = (Tier.VRAM, Tier.DRAM, Tier.VRAM, Tier.ABSENT)[step % 4]
            up_to = int(rng.integers(200, 8000))
            patches = tables.register(worker, tokens, tier, up_to)
            view.apply(patches)
            feed(writer, patches)
            region = topology.workers[worker].region
            for c in plan.registration_lengths[region]:
                if c <= min(up_to, len(tokens)):
                    held[(worker, prefix_keys(tokens, [c], NS)[c])] = tier
            for query in queries:
                got = reader.match(query)
                assert got == view.match(query)
                assert got == expected_match(topology, query, held)
                found += len(got.holders())
            for query in chained:
                got = reader.match(query)
                assert got == view.match(query)
                found_chained += len(got.holders())
        assert found > 0, "the queries should find holders"
        assert found_chained > 0, "the chained queries should find holders"
        grown = [t for t in tables.tables.values() if t.geometry.generation > 0]
        assert grown, "tables should have grown while the reader followed"


def expected_match(
    topology: Topology, query: MultiLevelQuery, held: dict[tuple[int, int], Tier]
) -> Match:
    n = len(topology.workers)
    lengths, tiers = [0] * n, [0] * n
    for w in topology.workers:
        for length, key in query.per_region.get(w.region, []):
            tier = held.get((w.index, key), Tier.ABSENT)
            if tier != Tier.ABSENT:
                lengths[w.index], tiers[w.index] = length, int(tier)
    return Match(lengths, tiers)


@dataclass
class TwoStates:
    """Two index states of the testbed whose answers differ, and the queries."""

    layout: IndexLayout
    n_shards: int
    queries: list[MultiLevelQuery]
    images: list[dict[tuple[int, int], bytes]]
    answers: list[list[Match]]

    @classmethod
    def make(cls) -> TwoStates:
        topology = topology_with("testbed-3region")
        tables = Tables.empty(topology, 2, capacity=512)
        rng = np.random.default_rng(11)
        prompts = [rng.integers(0, 128_000, 6000, dtype=np.uint32) for _ in range(3)]
        for worker, tokens in enumerate(prompts):
            tables.register(worker, tokens, Tier.VRAM)
        first = tables.images()
        tables.register(0, prompts[0], Tier.ABSENT)
        tables.register(10, prompts[0], Tier.DRAM)  # an asia worker
        tables.register(8, prompts[1], Tier.DRAM, up_to=4000)  # an eu worker
        second = tables.images()
        plan = plan_levels(topology)
        queries = [
            MultiLevelQuery.for_prompt(p, e, plan, NS) for p in prompts for e in ("us", "eu")
        ]
        views = [DiscoveryView.from_images(tables.layout, 2, i) for i in (first, second)]
        result = [answers(v, queries) for v in views]
        assert result[0] != result[1]
        return cls(tables.layout, 2, queries, [first, second], result)

    def writer(self, prefix: str, state: int) -> SharedIndexWriter:
        return start_writer(prefix, self.n_shards, len(self.layout.tables), self.images[state])


def test_reader_reports_a_closed_writer_and_reattaches_to_the_next(prefix: str) -> None:
    states = TwoStates.make()
    writer = states.writer(prefix, 0)
    reader = SharedIndexReader(prefix, states.layout)
    try:
        assert reader.ready()
        assert answers(reader, states.queries) == states.answers[0]
        first = writer.incarnation
        writer.close()
        # Everything this reader maps is still there, but it is a dead writer's.
        assert not reader.ready()
        assert reader.position(0)[2] is False
        with pytest.raises(IndexNotReady, match="no new writer") as caught:
            reader.match(states.queries[0])
        assert isinstance(caught.value, Transient)
        assert caught.value.retriable
        with pytest.raises(IndexNotReady):
            reader.lookup(0, 0, 1)
        with pytest.raises(IndexNotReady):
            reader.image(0, 0)

        writer = SharedIndexWriter(prefix, states.n_shards, len(states.layout.tables))
        assert writer.incarnation != first
        for (shard, table), image in states.images[1].items():
            writer.load_table(shard, table, image)
        # Loaded but not yet caught up: still not ready.
        assert not reader.ready()
        with pytest.raises(IndexNotReady, match=r"shard \d+ is not ready"):
            answers(reader, states.queries)
        for shard in range(states.n_shards):
            writer.set_position(shard, seq=1, epoch=2)
        assert reader.ready()
        assert reader.position(1) == (1, 2, True)
        assert answers(reader, states.queries) == states.answers[1]
    finally:
        reader.close()
        writer.close()


def test_readers_see_a_closing_writer_gone_before_its_segments_are(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = TwoStates.make()
    writer = states.writer(prefix, 0)
    with SharedIndexReader(prefix, states.layout) as reader:
        assert reader.ready()
        ready_at_unlink = []

        def unlink_after_asking(name: str) -> None:
            ready_at_unlink.append(reader.ready())
            segments.unlink(name)

        monkeypatch.setattr(shm_writer, "unlink", unlink_after_asking)
        writer.close()
        assert ready_at_unlink
        assert not any(ready_at_unlink)


def test_match_trusts_the_writers_liveness_for_the_ttl_only(prefix: str) -> None:
    """match asks the kernel whether the writer lives at most once per liveness TTL: a
    writer gone within it may still answer (its last state), never after it; a call that
    always asks (ready) and finds the writer gone ends that trust at once."""
    states = TwoStates.make()
    query = states.queries[0]
    writer = states.writer(prefix, 0)
    with contextlib.ExitStack() as stack:
        stack.callback(writer.close)
        trusting = stack.enter_context(
            SharedIndexReader(prefix, states.layout, liveness_ttl_s=3600.0)
        )
        expiring = stack.enter_context(
            SharedIndexReader(prefix, states.layout, liveness_ttl_s=0.05)
        )
        exact = stack.enter_context(SharedIndexReader(prefix, states.layout, liveness_ttl_s=0.0))
        for reader in (trusting, expiring, exact):
            assert reader.match(query) == states.answers[0][0]
        writer.close()
        with pytest.raises(IndexNotReady, match="no new writer"):
            exact.match(query)
        assert trusting.match(query) == states.answers[0][0], "within the TTL: last state"

        def refused() -> bool:
            try:
                expiring.match(query)
            except IndexNotReady:
                return True
            return False

        poll_until(refused, 30, "the expiring reader refuses once its TTL has passed")
        assert not trusting.ready()
        with pytest.raises(IndexNotReady, match="no new writer"):
            trusting.match(query)


def segment_inodes(prefix: str) -> dict[str, int]:
    """Inode of every segment of ``prefix`` in /dev/shm (the lock file apart)."""
    return {
        p.name: p.stat().st_ino
        for p in SHM_DIR.iterdir()
        if p.name.startswith(f"{prefix}-") and p.name.count("-") == prefix.count("-") + 1
    }


@dataclass
class WriterProcess:
    """A SharedIndexWriter in a separate interpreter, as an edge replayer runs it."""

    proc: subprocess.Popen[str]
    pid: int
    incarnation: int
    tracker_pid: int | None

    @classmethod
    def start(cls, prefix: str, states: TwoStates, state: int, tmp: Path) -> WriterProcess:
        images = tmp / f"images-{state}.pickle"
        n_tables = len(states.layout.tables)
        images.write_bytes(pickle.dumps((states.n_shards, n_tables, states.images[state])))
        proc = subprocess.Popen(
            [sys.executable, str(WRITER_SCRIPT), prefix, str(images)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"writer process exited with {proc.wait()}"
        info = json.loads(line)
        return cls(proc, info["pid"], info["incarnation"], info["tracker_pid"])

    def stop(self) -> int:
        """Close its stdin (a clean stop) and wait for its exit code."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def wait_gone(pid: int) -> None:
    """Until process ``pid`` (not our child) has exited."""

    def gone() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] in "ZX"  # exited, not yet reaped

    poll_until(gone, 30, f"process {pid} gone")


def test_reader_survives_a_sigkilled_writer_and_follows_its_successor(
    prefix: str, tmp_path: Path
) -> None:
    """The edge replayer is SIGKILLed and restarted: the reader never answers from the
    dead writer as ready, the dead writer's segments stay until its successor removes
    them, a second writer is refused while the first lives, and the reader follows the
    successor's new state."""
    states = TwoStates.make()
    with contextlib.ExitStack() as stack:
        first = WriterProcess.start(prefix, states, 0, tmp_path)
        stack.callback(first.close)
        reader = stack.enter_context(SharedIndexReader(prefix, states.layout))
        assert reader.ready()
        assert answers(reader, states.queries) == states.answers[0]
        with pytest.raises(PrefixInUse, match=f"'{prefix}' is in use by a live writer"):
            SharedIndexWriter(prefix, states.n_shards, len(states.layout.tables))
        assert answers(reader, states.queries) == states.answers[0]  # the refusal changed nothing
        left = segment_inodes(prefix)
        assert f"{prefix}-ctl" in left

        first.proc.kill()
        first.proc.wait()
        # The kernel dropped the dead writer's locks before it could be reaped: the very
        # next call knows, without any timeout.
        assert not reader.ready()
        with pytest.raises(IndexNotReady):
            reader.match(states.queries[0])
        assert reader.position(0)[2] is False
        if first.tracker_pid is not None:
            wait_gone(first.tracker_pid)  # whatever it would unlink, it has by now
        assert segment_inodes(prefix) == left, "a dead writer's segments belong to its successor"

        second = WriterProcess.start(prefix, states, 1, tmp_path)
        stack.callback(second.close)
        assert second.incarnation != first.incarnation
        poll_until(reader.ready, 30, "reader attached to the restarted writer")
        assert answers(reader, states.queries) == states.answers[1]
        now = segment_inodes(prefix)
        assert not set(left.items()) & set(now.items()), "stale segments were removed"

        assert second.stop() == 0
        assert not reader.ready()
        assert segment_inodes(prefix) == {}


def test_a_killed_writer_without_successor_is_cleaned_up_explicitly(
    prefix: str, tmp_path: Path
) -> None:
    states = TwoStates.make()
    with contextlib.ExitStack() as stack:
        writer = WriterProcess.start(prefix, states, 0, tmp_path)
        stack.callback(writer.close)
        with pytest.raises(PrefixInUse):
            remove_segments(prefix)
        assert f"{prefix}-ctl" in segment_inodes(prefix)
        writer.proc.kill()
        writer.proc.wait()
        remove_segments(prefix)
        assert segment_inodes(prefix) == {}


def test_a_second_writer_is_refused_and_prefixes_do_not_overlap(prefix: str) -> None:
    states = TwoStates.make()
    n_tables = len(states.layout.tables)
    # A writer whose prefix looks like one of the first writer's segment names.
    with (
        states.writer(f"{prefix}-s0t0g0n1", 1) as neighbour,
        SharedIndexReader(neighbour.prefix, states.layout) as neighbour_reader,
    ):
        with states.writer(prefix, 0), SharedIndexReader(prefix, states.layout) as reader:
            with pytest.raises(PrefixInUse, match=f"pid {os.getpid()}") as caught:
                SharedIndexWriter(prefix, states.n_shards, n_tables)
            assert isinstance(caught.value, ConfigError)
            assert answers(reader, states.queries) == states.answers[0]
            assert answers(neighbour_reader, states.queries) == states.answers[1]
        # Starting and stopping the first writer left its neighbour's segments alone.
        assert answers(neighbour_reader, states.queries) == states.answers[1]
        with states.writer(prefix, 1):  # the prefix is free again
            assert answers(neighbour_reader, states.queries) == states.answers[1]


def test_reader_refuses_a_foreign_layout_and_unknown_regions(prefix: str) -> None:
    states = TwoStates.make()
    with states.writer(prefix, 0):
        wide = IndexLayout.from_topology(topology_with("sim-8region"))
        with pytest.raises(ConfigError, match="holds 3 tables per shard, the reader's layout has"):
            SharedIndexReader(prefix, wide)
        with SharedIndexReader(prefix) as reader, pytest.raises(ConfigError, match="layout"):
            reader.match(states.queries[0])
        with SharedIndexReader(prefix, states.layout) as reader:
            with pytest.raises(BadInput, match="region 'mars'"):
                reader.match(MultiLevelQuery({"mars": [(128, 5)]}))
            with pytest.raises(BadInput, match="region 'mars'"):
                DiscoveryView.from_images(states.layout, 2, states.images[0]).match(
                    MultiLevelQuery({"mars": [(128, 5)]})
                )


# -- the sequence lock, deterministically ---------------------------------------------------


@dataclass
class Flip:
    """One shard, two keys of worker 0 (a us table) and worker 8 (the eu table) each, and
    one batch that changes all of them: a reader must see all old or all new values."""

    layout: IndexLayout
    writer: SharedIndexWriter
    query: MultiLevelQuery
    batch: dict[int, TablePatch]
    before: Match
    after: Match

    @classmethod
    @contextmanager
    def open(cls, prefix: str) -> Iterator[Flip]:
        topology = topology_with("testbed-3region")
        tables = Tables.empty(topology, 1, capacity=64)
        tokens = np.random.default_rng(5).integers(0, 128_000, 6000, dtype=np.uint32)
        tables.register(0, tokens, Tier.VRAM)
        tables.register(8, tokens, Tier.VRAM)
        images = tables.images()
        view = DiscoveryView.from_images(tables.layout, 1, images)
        # The longest prefix each worker holds, us first: a reader reads them in this order.
        keys = prefix_keys(tokens, [4096, 5648], NS)
        query = MultiLevelQuery({"us": [(4096, keys[4096])], "eu": [(5648, keys[5648])]})
        before = view.match(query)
        patches = tables.register(0, tokens, Tier.DRAM)
        patches.update(tables.register(8, tokens, Tier.ABSENT))
        assert all(p.reload is None and p.othello_reset is None for p in patches.values())
        assert {t for _, t in patches} == {0, 1}, "the batch should span two tables"
        view.apply(patches)
        after = view.match(query)
        assert before.holders() == {0: (4096, Tier.VRAM), 8: (5648, Tier.VRAM)}
        assert after.holders() == {0: (4096, Tier.DRAM)}
        with start_writer(prefix, 1, len(tables.layout.tables), images) as writer:
            batch = {table: patch for (_, table), patch in patches.items()}
            yield cls(tables.layout, writer, query, batch, before, after)


@pytest.mark.parametrize("mapped", [False, True], ids=["first-read", "tables-mapped"])
def test_a_write_during_a_read_section_is_never_seen_half_done(
    prefix: str, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    """The writer applies a whole batch right after the reader's compiled probes read the
    old values, inside one read section: the reader must retry, never answer from it.
    Both on the first read (it maps the tables) and once they are mapped (the reader's
    inline section)."""
    with Flip.open(prefix) as flip:
        match = probe_call.match
        writes: list[int] = []

        def probe_then_write(*args: Any) -> None:
            match(*args)
            if not writes:
                writes.append(1)
                flip.writer.apply(0, flip.batch)

        with SharedIndexReader(prefix, flip.layout) as reader:
            if mapped:
                assert reader.match(flip.query) == flip.before
            monkeypatch.setattr(probe_call, "match", probe_then_write)
            assert reader.match(flip.query) == flip.after
        assert writes, "the write should have happened inside the read section"


def test_a_reader_waits_out_a_writer_paused_mid_batch(prefix: str) -> None:
    """The writer stops between the two tables of one batch: the reader gives up with
    TornRead (a Transient) instead of answering from the half-applied batch, and answers
    from the whole batch once the writer finished."""
    with Flip.open(prefix) as flip:
        paused, resume = threading.Event(), threading.Event()
        second = flip.writer.view(0, 1)
        apply_second = second.apply

        def pause_then_apply(patch: TablePatch) -> None:
            paused.set()
            resume.wait(60)
            apply_second(patch)

        second.apply = pause_then_apply  # type: ignore[method-assign]
        with SharedIndexReader(prefix, flip.layout, wait_limit_s=0.2) as reader:
            assert reader.match(flip.query) == flip.before
            writer = threading.Thread(target=flip.writer.apply, args=(0, flip.batch))
            writer.start()
            try:
                assert paused.wait(60)
                with pytest.raises(TornRead, match="shard 0"):
                    reader.match(flip.query)
            finally:
                resume.set()
                writer.join(60)
            assert reader.match(flip.query) == flip.after
