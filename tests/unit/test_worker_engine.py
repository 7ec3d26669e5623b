"""The cost model and the emulated engine, on a manual clock (all times hand-computed)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.pipeline.clock import ManualClock
from kvcompass.topology import load_builtin
from kvcompass.virtual_time import VirtualClock
from kvcompass.worker import (
    CostModel,
    Emitted,
    EmulatedEngine,
    MigrationMode,
    PrefixCache,
    Request,
)
from kvcompass.worker.engine import queue_vector

NS = Namespace("m")
# Round numbers: β 0.1 ms/token, γ 0.01 ms/token, decode 10 ms + 1 ms per extra sequence.
COST = CostModel(
    beta_ms_per_token=0.1,
    gamma_ms_per_token=0.01,
    decode_ms_per_step=10.0,
    decode_ms_per_step_per_seq=1.0,
    intra_region_one_way_ms=0.5,
)


def tokens(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint32)


def engine(vram: int = 1000, dram: int = 1000) -> tuple[EmulatedEngine, ManualClock]:
    clock = ManualClock()
    return EmulatedEngine(PrefixCache(16, vram, dram, ()), COST, clock), clock


def run(e: EmulatedEngine, clock: ManualClock) -> list[Emitted]:
    """Drive the engine like the simulator: jump to each next event until idle."""
    out = []
    while (due := e.next_event_at()) is not None:
        clock.advance(max(due - clock.monotonic(), 0.0))
        out += e.advance()
    return out


def test_cost_model_terms() -> None:
    assert COST.prefill_ms(1000, 200) == pytest.approx(80.0)
    assert COST.reload_ms(320) == pytest.approx(3.2)
    assert COST.decode_step_ms(1) == pytest.approx(10.0)
    assert COST.decode_step_ms(4) == pytest.approx(13.0)
    assert COST.copy_ms(1000) == pytest.approx(10.5)


def test_cost_model_takes_its_constants_from_the_topology() -> None:
    topology = load_builtin("testbed-3region")
    cost = CostModel.for_worker(topology, topology.workers[0])
    assert cost.beta_ms_per_token == 0.085
    assert cost.gamma_ms_per_token == topology.gamma_ms_per_token
    assert cost.decode_step_ms(3) == pytest.approx(9.0 + 2 * 0.15)


def test_prefills_run_one_at_a_time_in_arrival_order() -> None:
    e, clock = engine()
    a = e.submit(Request("a", NS, tokens(0, 1000), 1))
    b = e.submit(Request("b", NS, tokens(5000, 500), 1))
    c = e.submit(Request("c", NS, tokens(9000, 200), 1))
    run(e, clock)
    assert [s.timings().queue for s in (a, b, c)] == pytest.approx([0.0, 100.0, 150.0])
    assert [s.timings().ttft for s in (a, b, c)] == pytest.approx([100.0, 150.0, 170.0])


def test_queue_ms_is_the_wait_a_new_arrival_would_see() -> None:
    e, clock = engine()
    assert e.queue_ms() == 0.0
    e.submit(Request("a", NS, tokens(0, 1000), 1))  # starts now: 100 ms
    e.submit(Request("b", NS, tokens(5000, 500), 1))  # queued: 50 ms
    assert e.queue_ms() == pytest.approx(150.0)
    clock.advance(0.04)
    assert e.queue_ms() == pytest.approx(110.0)
    clock.advance(0.07)  # a done at 100 ms, b runs until 150 ms
    e.advance()
    assert e.queue_ms() == pytest.approx(40.0)


def test_a_queue_vector_is_every_engine_s_queue_by_its_index() -> None:
    clock = ManualClock()
    busy, queued, idle = (
        EmulatedEngine(PrefixCache(16, 1000, 1000, ()), COST, clock) for _ in "abc"
    )
    busy.submit(Request("a", NS, tokens(0, 1000), 1))  # running: 100 ms
    queued.submit(Request("b", NS, tokens(0, 500), 1))
    queued.submit(Request("c", NS, tokens(5000, 500), 1))  # 50 ms behind b's 50
    clock.advance(0.03)
    engines = (busy, queued, idle)
    vector = queue_vector((7, 3, 11), engines)
    assert vector == {7: busy.queue_ms(), 3: queued.queue_ms(), 11: idle.queue_ms()}
    assert list(vector.values()) == pytest.approx([70.0, 70.0, 0.0])
    with pytest.raises(ValueError, match="2 indices for 3 engines"):
        queue_vector((7, 3), engines)
    with pytest.raises(TypeError):
        queue_vector((7,), (object(),))  # type: ignore[arg-type]


def test_queue_ms_counts_a_queued_request_net_of_its_cached_prefix() -> None:
    e, _ = engine()
    e.submit(Request("a", NS, tokens(0, 1000), 1))  # its blocks are taken at its start
    e.submit(Request("b", NS, tokens(0, 1000), 1))  # 992 of 1000 tokens already cached
    assert e.queue_ms() == pytest.approx(100.0 + 0.8)


def test_reuse_is_looked_up_when_the_prefill_starts() -> None:
    e, clock = engine()
    e.submit(Request("a", NS, tokens(0, 640), 1))
    b = e.submit(Request("b", NS, tokens(0, 700), 1))  # arrives before a is cached...
    run(e, clock)
    assert b.reused.tokens == 640  # ...but a was cached when b started
    assert b.timings().prefill == pytest.approx(6.0)


def test_a_dram_hit_pays_the_reload() -> None:
    e, clock = engine(vram=40, dram=100)
    e.submit(Request("a", NS, tokens(0, 640), 1))  # 40 blocks: VRAM full
    e.submit(Request("b", NS, tokens(10_000, 640), 1))  # demotes all of a to DRAM
    run(e, clock)
    assert e.cache.match(NS, tokens(0, 640)).dram_tokens == 640
    c = e.submit(Request("c", NS, tokens(0, 800), 1))
    run(e, clock)
    assert c.reused.tier is Tier.DRAM
    assert c.timings().reload == pytest.approx(6.4)  # γ·640
    assert c.timings().prefill == pytest.approx(16.0)  # β·160
    assert c.timings().ttft == pytest.approx(22.4)


def test_decode_steps_slow_down_as_the_batch_grows() -> None:
    e, clock = engine()
    a = e.submit(Request("a", NS, tokens(0, 100), 3))  # prefill 10 ms
    b = e.submit(Request("b", NS, tokens(5000, 100), 3))  # prefill 10..20 ms
    emitted = run(e, clock)
    times = {(x.sequence.request.request_id, x.index): round(x.at * 1e3, 6) for x in emitted}
    # a: token 0 at 10; a alone steps 10→20; from 20 a and b share steps of 11 ms.
    assert times == {
        ("a", 0): 10.0,
        ("b", 0): 20.0,
        ("a", 1): 20.0,
        ("a", 2): 31.0,
        ("b", 1): 31.0,
        ("b", 2): 41.0,  # b alone again
    }
    assert a.timings().decode == pytest.approx(21.0)
    assert b.timings().decode == pytest.approx(21.0)
    assert [x.last for x in emitted if x.sequence is a] == [False, False, True]


def test_events_are_stamped_with_their_due_time_even_when_advanced_late() -> None:
    e, clock = engine()
    e.submit(Request("a", NS, tokens(0, 100), 2))
    clock.advance(1.0)  # a driver that woke a second late
    assert [round(x.at * 1e3, 6) for x in e.advance()] == [10.0, 20.0]
    assert e.next_event_at() is None


def test_recompute_migration_queues_a_prefill_into_dram() -> None:
    e, clock = engine()
    e.migrate(NS, tokens(0, 320), MigrationMode.RECOMPUTE)
    late = e.submit(Request("a", NS, tokens(9000, 100), 1))
    assert e.cache.match(NS, tokens(0, 320)).dram_tokens == 320
    run(e, clock)
    assert late.timings().queue == pytest.approx(32.0)  # behind the migration's prefill


def test_copy_migration_lands_after_the_copy_without_queueing() -> None:
    e, clock = engine()
    e.migrate(NS, tokens(0, 320), MigrationMode.COPY)
    a = e.submit(Request("a", NS, tokens(9000, 100), 1))
    assert e.cache.match(NS, tokens(0, 320)).tokens == 0
    assert e.next_event_at() == pytest.approx((0.5 + 3.2) / 1e3)
    run(e, clock)
    assert a.timings().queue == 0.0
    assert e.cache.match(NS, tokens(0, 320)).dram_tokens == 320


def test_reset_drops_every_job_and_the_cache() -> None:
    e, _ = engine()
    a = e.submit(Request("a", NS, tokens(0, 100), 5))
    b = e.submit(Request("b", NS, tokens(500, 100), 5))
    assert set(e.reset()) == {a, b}
    assert a.aborted
    assert b.aborted
    assert e.next_event_at() is None
    assert e.queue_ms() == 0.0
    assert e.cache.match(NS, tokens(0, 100)).tokens == 0


def test_a_request_needs_an_output_token() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        Request("a", NS, tokens(0, 10), 0)


def _three_jobs(e: EmulatedEngine) -> None:
    e.submit(Request("a", NS, tokens(0, 100), 7))  # prefill 0-10 ms, decode alone at first
    e.submit(Request("b", NS, tokens(1000, 250), 3))  # prefill 10-35 ms, joins a at 40
    e.migrate(NS, tokens(5000, 320), MigrationMode.COPY)  # lands at 0.5 + 3.2 ms


def test_waking_only_at_notable_events_emits_the_same_tokens_at_the_same_times() -> None:
    every, every_clock = engine()
    _three_jobs(every)
    want = run(every, every_clock)
    e, clock = engine()
    _three_jobs(e)
    got, wakes = [], []
    while (due := e.next_notable_at()) is not None:
        clock.advance(max(due - clock.monotonic(), 0.0))
        wakes.append(due)
        got += e.advance()
    assert [(t.sequence.request.request_id, t.index, t.at, t.last) for t in got] == [
        (t.sequence.request.request_id, t.index, t.at, t.last) for t in want
    ]
    # The copy, a's first token, b's first token, b's last (two 11 ms steps of two after
    # the step b joins at 40 ms), a's last (10 ms alone); not the plain steps, nor the
    # step b joins after (a's 2nd-4th tokens and the join change no output).
    assert wakes == pytest.approx([0.0037, 0.010, 0.035, 0.062, 0.072])
    assert e.cache.match(NS, tokens(5000, 320)).tokens == 320


def test_without_streaming_only_first_and_last_tokens_come_out() -> None:
    every, every_clock = engine()
    _three_jobs(every)
    want = [t for t in run(every, every_clock) if t.index == 0 or t.last]
    e, clock = engine()
    e.stream = False
    _three_jobs(e)
    got = run(e, clock)
    assert [(t.sequence.request.request_id, t.index, t.at, t.last) for t in got] == [
        (t.sequence.request.request_id, t.index, t.at, t.last) for t in want
    ]
    assert len(got) == 4


def test_without_streaming_one_late_advance_applies_every_step_in_order() -> None:
    every, every_clock = engine()
    _three_jobs(every)
    want = [t for t in run(every, every_clock) if t.index == 0 or t.last]
    e, clock = engine()
    e.stream = False
    _three_jobs(e)
    clock.advance(1.0)  # far past the end: the plain steps are ended in bulk
    got = e.advance()
    assert [(t.sequence.request.request_id, t.index, t.at, t.last) for t in got] == [
        (t.sequence.request.request_id, t.index, t.at, t.last) for t in want
    ]
    assert [t.sequence.generated for t in got if t.last] == [3, 7]
    assert e.next_event_at() is None


def _random_jobs(seed: int) -> list[tuple[float, Request | None]]:
    """Arrivals at random times: completions (some sharing a prefix) and, for None, a
    copy migration."""
    rng = random.Random(seed)
    at = 0.0
    jobs: list[tuple[float, Request | None]] = []
    for i in range(60):
        at += rng.expovariate(1 / 0.02)
        if rng.random() < 0.1:
            jobs.append((at, None))
            continue
        start = rng.choice([0, 0, 100_000 * i])
        prompt = tokens(start, rng.randint(16, 600))
        jobs.append((at, Request(f"r{i}", NS, prompt, rng.choice([1, 2, rng.randint(1, 80)]))))
    return jobs


def _drive(
    seed: int,
    stream: bool,
    wake: Callable[[EmulatedEngine, random.Random], float | None],
    late_tokens: list[Emitted] | None = None,
) -> tuple[list[tuple[str, int, float, bool]], list[float]]:
    """First and last tokens, and the queue after each arrival, with the engine advanced
    at the times ``wake`` names (and at each arrival). Tokens a wake brings out that were
    due before it go to ``late_tokens``."""
    clock = VirtualClock()
    e = EmulatedEngine(PrefixCache(16, 200, 400, ()), COST, clock, stream=stream)
    rng = random.Random(seed)
    out: list[Emitted] = []
    queues = []
    wakes = 0
    for at, job in [*_random_jobs(seed), (math.inf, None)]:
        while (due := wake(e, rng)) is not None and due < at:
            wakes += 1
            assert wakes < 50_000, "a wake that processes nothing (the same due again)"
            clock.set(max(due, clock.monotonic()))
            emitted = e.advance()
            if late_tokens is not None:
                late_tokens += [t for t in emitted if t.at < due]
            out += emitted
        if at == math.inf:
            break
        clock.set(at)
        if job is None:
            e.migrate(NS, tokens(0, 320), MigrationMode.COPY)
        else:
            e.submit(job)
        queues.append(e.queue_ms())
    firsts_and_lasts = [(t.sequence.request.request_id, t.index, t.at, t.last) for t in out]
    return [t for t in firsts_and_lasts if t[1] == 0 or t[3]], queues


@pytest.mark.parametrize("seed", range(8))
def test_without_streaming_random_jobs_come_out_as_with_every_step(seed: int) -> None:
    """Waking at notable events only, or at random times, skips plain decode steps in
    bulk (counted once per batch): every token and queue is the same float as when every
    step is ended one by one."""

    def late(e: EmulatedEngine, rng: random.Random) -> float | None:
        due = e.next_event_at()
        return None if due is None else due + rng.choice([0.0, rng.uniform(0.0, 0.2)])

    want = _drive(seed, True, lambda e, _: e.next_event_at())
    assert len(want[0]) > 60
    late_tokens: list[Emitted] = []
    assert _drive(seed, False, lambda e, _: e.next_notable_at(), late_tokens) == want
    # Never past a first or last token either: a simulator reads its clock at the wake
    # (the queues a response piggybacks), so a late wake would change what it records.
    assert late_tokens == []
    assert _drive(seed, False, late) == want
