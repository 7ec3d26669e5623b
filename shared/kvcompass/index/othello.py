"""The Othello locator, maintenance side: a 1-bit classifier kept as a forest.

Every key is an edge between an A-side node and a B-side node; its bit is
``bit(a) XOR bit(b)``. While the graph is a forest any bits are satisfiable, and changing
one key's bit means flipping every node on one side of its edge. We always flip the
smaller side, found by exploring both sides alternately (Ludo's A-side-only flip costs
about 3x more cells). A new edge that would close a cycle cannot be satisfied in
general, so the caller rebuilds the whole locator with a new hash seed instead.

Adjacency is intrusive linked lists over half-edges ``2·kid + side`` (``kid`` is a
stable key id, not a table position, so cuckoo moves never relink), stored in compact
``array`` objects: Python-level indexing of those is several times faster than numpy's.
"""

from __future__ import annotations

from array import array

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import breadth_first_order, connected_components

__all__ = ["OthelloGraph"]


class OthelloGraph:
    """Bits, adjacency and key ids of one locator; the table decides edges and bits."""

    def __init__(self, n_nodes: int, n_words: int, max_keys: int) -> None:
        self.n_nodes = n_nodes
        self.words = array("Q", bytes(8 * n_words))
        self._head = array("i", [-1]) * n_nodes
        self._next = array("i", [-1]) * (2 * max_keys)
        self._node = array("i", [-1]) * (2 * max_keys)
        self._free: list[int] = list(range(max_keys - 1, -1, -1))
        self.dirty_words: set[int] = set()

    # -- bits --------------------------------------------------------------------

    def bit(self, node: int) -> int:
        return (self.words[node >> 6] >> (node & 63)) & 1

    def _flip(self, nodes: list[int]) -> None:
        words, dirty = self.words, self.dirty_words
        for n in nodes:
            w = n >> 6
            words[w] ^= 1 << (n & 63)
            dirty.add(w)

    # -- graph queries -------------------------------------------------------------

    def smaller_side(self, u: int, v: int, skip_kid: int = -1) -> list[int] | None:
        """Nodes of the smaller of u's and v's trees, ignoring ``skip_kid``'s edge.

        Returns None when u and v are connected (adding an edge u–v closes a cycle).
        Both sides are explored one node at a time, so the cost is about twice the
        smaller side, not the whole component.
        """
        head, nxt, node = self._head, self._next, self._node
        # An isolated node is a whole tree of one: the common case at any load
        # (about half of all cells have no edge), answered without exploring.
        if skip_kid < 0:
            if head[u] < 0:
                return [u]
            if head[v] < 0:
                return [v]
        seen_u = {u}
        seen_v = {v}
        stack_u = [u]
        stack_v = [v]
        while True:
            if not stack_u:
                return list(seen_u)
            h = head[stack_u.pop()]
            while h >= 0:
                if h >> 1 != skip_kid:
                    m = node[h ^ 1]
                    if m not in seen_u:
                        if m in seen_v:
                            return None
                        seen_u.add(m)
                        stack_u.append(m)
                h = nxt[h]
            if not stack_v:
                return list(seen_v)
            h = head[stack_v.pop()]
            while h >= 0:
                if h >> 1 != skip_kid:
                    m = node[h ^ 1]
                    if m not in seen_v:
                        if m in seen_u:
                            return None
                        seen_v.add(m)
                        stack_v.append(m)
                h = nxt[h]

    def endpoints(self, kid: int) -> tuple[int, int]:
        return self._node[2 * kid], self._node[2 * kid + 1]

    # -- edits -------------------------------------------------------------------

    def add_edge(self, a: int, b: int, bit: int, smaller_tree: list[int]) -> int:
        """Add edge a–b carrying ``bit``; ``smaller_tree`` is from :meth:`smaller_side`.

        Returns the new key id.
        """
        if bit ^ self.bit(a) ^ self.bit(b):
            self._flip(smaller_tree)
        kid = self._free.pop()
        self._link(2 * kid, a)
        self._link(2 * kid + 1, b)
        return kid

    def toggle(self, kid: int) -> None:
        """Invert one key's bit (its key moved to the other candidate bucket)."""
        a, b = self.endpoints(kid)
        side = self.smaller_side(a, b, skip_kid=kid)
        if side is None:  # pragma: no cover - the graph is a forest by construction
            raise AssertionError("Othello graph has a cycle")
        self._flip(side)

    def remove_edge(self, kid: int) -> None:
        """Forget a key's edge. No bit changes: every other key keeps its XOR."""
        self._unlink(2 * kid)
        self._unlink(2 * kid + 1)
        self._free.append(kid)

    def _link(self, h: int, n: int) -> None:
        self._node[h] = n
        self._next[h] = self._head[n]
        self._head[n] = h

    def _unlink(self, h: int) -> None:
        n = self._node[h]
        cur = self._head[n]
        if cur == h:
            self._head[n] = self._next[h]
        else:
            nxt = self._next
            while nxt[cur] != h:
                cur = nxt[cur]
            nxt[cur] = nxt[h]
        self._node[h] = -1
        self._next[h] = -1

    # -- bulk build ----------------------------------------------------------------

    def rebuild(
        self, a: NDArray[np.int64], b: NDArray[np.int64], bits: NDArray[np.uint8]
    ) -> NDArray[np.int64] | None:
        """Replace the whole locator by one holding edges a[i]–b[i] with ``bits[i]``.

        Returns the key id of every edge (``i``), or None, changing nothing, when the
        edges contain a cycle (the caller then draws a new hash seed).
        """
        n_edges = len(a)
        words = _solve_forest(self.n_nodes, a, b, bits)
        if words is None:
            return None
        self.words = array("Q", words.tobytes())
        self.dirty_words.clear()
        kids = np.arange(n_edges, dtype=np.int64)
        half = np.empty(2 * n_edges, dtype=np.int64)
        half[0::2] = a
        half[1::2] = b
        order = np.argsort(half, kind="stable")
        sorted_nodes = half[order]
        nxt = np.full(len(self._next), -1, dtype=np.int32)
        same = sorted_nodes[1:] == sorted_nodes[:-1]
        nxt[order[:-1][same]] = order[1:][same]
        head = np.full(self.n_nodes, -1, dtype=np.int32)
        first = np.ones(len(order), dtype=bool)
        first[1:] = ~same
        head[sorted_nodes[first]] = order[first]
        node = np.full(len(self._node), -1, dtype=np.int32)
        node[: 2 * n_edges] = half
        self._head = array("i", head.tobytes())
        self._next = array("i", nxt.tobytes())
        self._node = array("i", node.tobytes())
        max_keys = len(self._next) // 2
        self._free = list(range(max_keys - 1, n_edges - 1, -1))
        return kids


def _solve_forest(
    n_nodes: int, a: NDArray[np.int64], b: NDArray[np.int64], bits: NDArray[np.uint8]
) -> NDArray[np.uint64] | None:
    """Packed node bits with bit(a[i]) ^ bit(b[i]) == bits[i], or None if not a forest."""
    n_edges = len(a)
    ones = np.ones(n_edges, dtype=np.int8)
    graph = coo_matrix((ones, (a, b)), shape=(n_nodes, n_nodes)).tocsr()
    n_comp, labels = connected_components(graph, directed=False)
    # A forest has exactly nodes − components edges; a duplicate edge (a 2-cycle) is
    # merged by the sparse matrix but still counted here.
    if n_edges != n_nodes - n_comp:
        return None
    val = np.zeros(n_nodes + 1, dtype=np.uint8)
    if n_edges:
        # One BFS from a virtual root joined to one node of every tree yields a parent
        # for every node; a node's bit is then the XOR of edge bits up to its root.
        root = n_nodes
        _, firsts = np.unique(labels, return_index=True)
        rows = np.concatenate([a, np.full(len(firsts), root, dtype=np.int64)])
        cols = np.concatenate([b, firsts.astype(np.int64)])
        g2 = coo_matrix(
            (np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n_nodes + 1, n_nodes + 1)
        ).tocsr()
        _, pred = breadth_first_order(g2, root, directed=False, return_predecessors=True)
        parent = pred.astype(np.int64)
        parent[root] = root
        child_is_b = parent[b] == a
        val[b[child_is_b]] = bits[child_is_b]
        val[a[~child_is_b]] = bits[~child_is_b]
        # Pointer jumping: after k rounds every node holds the XOR of 2^k path edges.
        while True:
            done = parent == root
            if done.all():
                break
            val ^= val[parent]
            parent = parent[parent]
            val[root] = 0
    packed = np.packbits(val[:n_nodes], bitorder="little")
    n_words = (n_nodes + 63) // 64
    out = np.zeros(n_words * 8, dtype=np.uint8)
    out[: len(packed)] = packed
    return out.view(np.uint64)
