"""The Othello locator's maintenance graph: bits stay satisfied, cycles are detected."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest

from kvcompass.index.othello import OthelloGraph

MA, MB = 40, 30
N_NODES = MA + MB
N_WORDS = (N_NODES + 63) // 64
MAX_KEYS = MB

Edges = dict[int, tuple[int, int, int]]  # kid -> (a, b, bit)


def component(edges: Edges, start: int, skip_kid: int = -1) -> set[int]:
    """Nodes reachable from ``start`` over ``edges`` without ``skip_kid``'s edge (BFS)."""
    adjacency: dict[int, list[int]] = {}
    for kid, (a, b, _) in edges.items():
        if kid != skip_kid:
            adjacency.setdefault(a, []).append(b)
            adjacency.setdefault(b, []).append(a)
    seen = {start}
    queue = deque([start])
    while queue:
        for m in adjacency.get(queue.popleft(), []):
            if m not in seen:
                seen.add(m)
                queue.append(m)
    return seen


def check_bits(graph: OthelloGraph, edges: Edges) -> None:
    for kid, (a, b, bit) in edges.items():
        assert graph.endpoints(kid) == (a, b)
        assert graph.bit(a) ^ graph.bit(b) == bit, f"key {kid} edge {a}-{b}"


def check_smaller_side(graph: OthelloGraph, edges: Edges, u: int, v: int, skip: int = -1) -> None:
    side = graph.smaller_side(u, v, skip_kid=skip)
    cu, cv = component(edges, u, skip), component(edges, v, skip)
    if v in cu:
        assert side is None
        return
    assert side is not None
    assert len(side) == len(set(side))
    # The whole tree of one endpoint, never larger than the other endpoint's tree.
    assert set(side) in (cu, cv)
    other = cv if set(side) == cu else cu
    assert len(side) <= len(other)


def random_node_pair(rng: random.Random) -> tuple[int, int]:
    return rng.randrange(MA), MA + rng.randrange(MB)


@pytest.mark.parametrize("seed", range(8))
def test_random_edit_sequences_keep_every_bit(seed: int) -> None:
    rng = random.Random(seed)
    graph = OthelloGraph(N_NODES, N_WORDS, MAX_KEYS)
    edges: Edges = {}
    cycles = toggles = removals = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.5 and len(edges) < MAX_KEYS:
            a, b = random_node_pair(rng)
            check_smaller_side(graph, edges, a, b)
            side = graph.smaller_side(a, b)
            if side is None:
                cycles += 1
                continue
            bit = rng.randrange(2)
            kid = graph.add_edge(a, b, bit, side)
            assert kid not in edges
            assert 0 <= kid < MAX_KEYS
            edges[kid] = (a, b, bit)
        elif op < 0.8 and edges:
            kid = rng.choice(sorted(edges))
            a, b, bit = edges[kid]
            before = [graph.bit(n) for n in range(N_NODES)]
            graph.toggle(kid)
            edges[kid] = (a, b, bit ^ 1)
            toggles += 1
            # Exactly one side of the edge flipped, and it was the smaller one.
            flipped = {n for n in range(N_NODES) if graph.bit(n) != before[n]}
            ca, cb = component(edges, a, kid), component(edges, b, kid)
            assert flipped in (ca, cb)
            assert len(flipped) <= max(len(ca), len(cb))
            assert len(flipped) <= len(ca if flipped == cb else cb)
        elif edges:
            kid = rng.choice(sorted(edges))
            before = [graph.bit(n) for n in range(N_NODES)]
            graph.remove_edge(kid)
            del edges[kid]
            removals += 1
            assert [graph.bit(n) for n in range(N_NODES)] == before
        check_bits(graph, edges)
        u, v = rng.randrange(N_NODES), rng.randrange(N_NODES)
        if u != v:
            check_smaller_side(graph, edges, u, v)
        if edges:
            kid = rng.choice(sorted(edges))
            a, b, _ = edges[kid]
            check_smaller_side(graph, edges, a, b, skip=kid)
    assert cycles > 0
    assert toggles > 0
    assert removals > 0


def test_dirty_words_cover_every_changed_word() -> None:
    rng = random.Random(99)
    graph = OthelloGraph(N_NODES, N_WORDS, MAX_KEYS)
    kids: list[int] = []
    for _ in range(200):
        before = graph.words.copy()
        graph.take_dirty_words()
        a, b = random_node_pair(rng)
        side = graph.smaller_side(a, b)
        if side is not None and len(kids) < MAX_KEYS:
            kids.append(graph.add_edge(a, b, rng.randrange(2), side))
        elif kids:
            graph.toggle(rng.choice(kids))
        changed = set(np.flatnonzero(graph.words != before).tolist())
        dirty = graph.take_dirty_words().tolist()
        assert len(dirty) == len(set(dirty))  # each word reported once
        assert changed <= set(dirty)


def test_smaller_side_of_isolated_nodes() -> None:
    graph = OthelloGraph(N_NODES, N_WORDS, MAX_KEYS)
    assert graph.smaller_side(0, MA) == [0]
    kid = graph.add_edge(0, MA, 1, [0])
    assert graph.bit(0) ^ graph.bit(MA) == 1
    assert graph.smaller_side(0, MA) is None
    assert sorted(graph.smaller_side(0, MA, skip_kid=kid) or []) == [0]
    assert sorted(graph.smaller_side(1, MA) or []) == [1]
    graph.remove_edge(kid)
    assert graph.smaller_side(0, MA) == [0]


def test_key_ids_are_reused_after_removal() -> None:
    graph = OthelloGraph(N_NODES, N_WORDS, 3)
    kids = [graph.add_edge(i, MA + i, 0, [i]) for i in range(3)]
    assert sorted(kids) == [0, 1, 2]
    graph.remove_edge(kids[1])
    assert graph.add_edge(5, MA + 5, 1, [5]) == kids[1]


def rebuild_arrays(pairs: list[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    bits = np.array([p[2] for p in pairs], dtype=np.uint8)
    return a, b, bits


def random_forest(rng: random.Random, n_edges: int) -> list[tuple[int, int, int]]:
    edges: Edges = {}
    pairs: list[tuple[int, int, int]] = []
    while len(pairs) < n_edges:
        a, b = random_node_pair(rng)
        if b not in component(edges, a):
            edges[len(pairs)] = (a, b, rng.randrange(2))
            pairs.append(edges[len(pairs)])
    return pairs


@pytest.mark.parametrize("seed", range(6))
def test_rebuild_solves_a_forest(seed: int) -> None:
    rng = random.Random(seed)
    pairs = random_forest(rng, rng.randrange(0, MAX_KEYS + 1))
    graph = OthelloGraph(N_NODES, N_WORDS, MAX_KEYS)
    graph.add_edge(0, MA, 1, [0])  # flips word 0: dirty
    kids = graph.rebuild(*rebuild_arrays(pairs))
    assert kids is not None
    assert kids.tolist() == list(range(len(pairs)))
    assert len(graph.take_dirty_words()) == 0
    edges = dict(enumerate(pairs))
    check_bits(graph, edges)
    # The rebuilt adjacency answers like a graph built edge by edge.
    for _ in range(50):
        u, v = rng.randrange(N_NODES), rng.randrange(N_NODES)
        if u != v:
            check_smaller_side(graph, edges, u, v)
    # And it stays editable: toggles, removals and new edges with fresh ids.
    for kid in list(edges)[:5]:
        graph.toggle(kid)
        a, b, bit = edges[kid]
        edges[kid] = (a, b, bit ^ 1)
    for kid in list(edges)[5:8]:
        graph.remove_edge(kid)
        del edges[kid]
    for _ in range(100):
        a, b = random_node_pair(rng)
        side = graph.smaller_side(a, b)
        if side is not None and len(edges) < MAX_KEYS:
            kid = graph.add_edge(a, b, 1, side)
            assert kid not in edges
            edges[kid] = (a, b, 1)
    check_bits(graph, edges)


def test_rebuild_a_long_path() -> None:
    # A path through every node: the bit of the far end depends on every edge.
    rng = random.Random(7)
    n = 20
    pairs = []
    for i in range(n):
        pairs.append((i, MA + i, rng.randrange(2)))
        if i + 1 < n:
            pairs.append((i + 1, MA + i, rng.randrange(2)))
    graph = OthelloGraph(N_NODES, N_WORDS, len(pairs))
    assert graph.rebuild(*rebuild_arrays(pairs)) is not None
    check_bits(graph, dict(enumerate(pairs)))


@pytest.mark.parametrize(
    "pairs",
    [
        # A duplicated edge is a 2-cycle, whatever its bits.
        [(0, MA, 0), (0, MA, 0)],
        [(0, MA, 0), (0, MA, 1), (3, MA + 4, 1)],
        # A 4-cycle a0-b0-a1-b1-a0.
        [(0, MA, 1), (1, MA, 0), (1, MA + 1, 1), (0, MA + 1, 0)],
        # A 6-cycle hidden among tree edges.
        [
            (2, MA + 9, 1),
            (0, MA, 0),
            (1, MA, 0),
            (1, MA + 1, 0),
            (2, MA + 1, 1),
            (2, MA + 2, 0),
            (0, MA + 2, 1),
            (7, MA + 7, 1),
        ],
    ],
)
def test_rebuild_refuses_a_cycle_and_changes_nothing(pairs: list[tuple[int, int, int]]) -> None:
    rng = random.Random(1)
    forest = random_forest(rng, 10)
    graph = OthelloGraph(N_NODES, N_WORDS, MAX_KEYS)
    assert graph.rebuild(*rebuild_arrays(forest)) is not None
    words = list(graph.words)
    assert graph.rebuild(*rebuild_arrays(pairs)) is None
    assert list(graph.words) == words
    check_bits(graph, dict(enumerate(forest)))


def test_rebuild_of_nothing_clears_every_bit() -> None:
    graph = OthelloGraph(N_NODES, N_WORDS, MAX_KEYS)
    graph.add_edge(0, MA, 1, [0])
    empty = np.zeros(0, dtype=np.int64)
    kids = graph.rebuild(empty, empty, np.zeros(0, dtype=np.uint8))
    assert kids is not None
    assert len(kids) == 0
    assert all(w == 0 for w in graph.words)
    assert graph.smaller_side(0, MA) == [0]
