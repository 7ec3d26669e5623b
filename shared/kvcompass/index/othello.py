"""The Othello locator, maintenance side: a 1-bit classifier kept as a forest.

Every key is an edge between an A-side node and a B-side node; its bit is
``bit(a) XOR bit(b)``. While the graph is a forest any bits are satisfiable, and changing
one key's bit means flipping every node on one side of its edge. We always flip the
smaller side, found by exploring both sides alternately (Ludo's A-side-only flip costs
about 3x more cells). A new edge that would close a cycle cannot be satisfied in
general, so the caller rebuilds the whole locator with a new hash seed instead.

Adjacency is intrusive linked lists over half-edges ``2·kid + side`` (``kid`` is a
stable key id, not a table position, so cuckoo moves never relink), in flat numpy arrays
that the compiled write path (:mod:`kvcompass.index.kernel`) edits in place.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import breadth_first_order, connected_components

from kvcompass.index import kernel
from kvcompass.index.kernel import OthelloArrays

__all__ = ["OthelloGraph"]

#: What take_dirty_words returns when nothing flipped (read-only: callers share it).
_NO_WORDS = np.zeros(0, dtype=np.int64)
_NO_WORDS.setflags(write=False)


class OthelloGraph:
    """Bits, adjacency and key ids of one locator; the table decides edges and bits."""

    def __init__(self, n_nodes: int, n_words: int, max_keys: int) -> None:
        self.n_nodes = n_nodes
        self.arrays = OthelloArrays(
            words=np.zeros(n_words, dtype=np.uint64),
            head=np.full(n_nodes, -1, dtype=np.int32),
            nxt=np.full(2 * max_keys, -1, dtype=np.int32),
            node=np.full(2 * max_keys, -1, dtype=np.int32),
            # Key ids are handed out from the top of the stack: 0, 1, 2, ...
            free=np.arange(max_keys - 1, -1, -1, dtype=np.int32),
            word_dirty=np.zeros(n_words, dtype=np.uint8),
            dirty_words=np.zeros(n_words, dtype=np.int64),
            mark=np.zeros(n_nodes, dtype=np.int32),
            state=np.array([max_keys, 0, 0], dtype=np.int64),
        )
        self._scratch = np.empty(64, dtype=np.int32)

    @property
    def words(self) -> NDArray[np.uint64]:
        """The node bits, packed 64 per word (the view's locator image)."""
        return self.arrays.words

    def set_words(self, words: NDArray[np.uint64]) -> None:
        """Replace every node bit (a restored snapshot's stored bits)."""
        self.arrays.words[:] = words

    # -- bits --------------------------------------------------------------------

    def bit(self, node: int) -> int:
        return int(self.arrays.words[node >> 6] >> np.uint64(node & 63)) & 1

    def take_dirty_words(self) -> NDArray[np.int64]:
        """Words flipped since the last call (each once), and forget them."""
        a = self.arrays
        n = int(a.state[1])
        if not n:
            return _NO_WORDS
        words = a.dirty_words[:n].copy()
        a.word_dirty[words] = 0
        a.state[1] = 0
        return words

    # -- graph queries -------------------------------------------------------------

    def smaller_side(self, u: int, v: int, skip_kid: int = -1) -> list[int] | None:
        """Nodes of the smaller of u's and v's trees, ignoring ``skip_kid``'s edge.

        Returns None when u and v are connected (adding an edge u–v closes a cycle).
        Both sides are explored one node at a time, so the cost is about twice the
        smaller side, not the whole component.
        """
        count, nodes = kernel.othello_smaller_side(self.arrays, u, v, skip_kid, self._scratch)
        return None if count == kernel.CYCLE else nodes[:count].tolist()

    def endpoints(self, kid: int) -> tuple[int, int]:
        node = self.arrays.node
        return int(node[2 * kid]), int(node[2 * kid + 1])

    # -- edits -------------------------------------------------------------------

    def add_edge(self, a: int, b: int, bit: int, smaller_tree: list[int]) -> int:
        """Add edge a–b carrying ``bit``; ``smaller_tree`` is from :meth:`smaller_side`.

        Returns the new key id.
        """
        side = np.asarray(smaller_tree, dtype=np.int32)
        return int(kernel.othello_add_edge(self.arrays, a, b, bit, side, len(side)))

    def toggle(self, kid: int) -> None:
        """Invert one key's bit (its key moved to the other candidate bucket)."""
        if not kernel.othello_toggle(self.arrays, kid, self._scratch):  # pragma: no cover
            raise AssertionError("Othello graph has a cycle")

    def remove_edge(self, kid: int) -> None:
        """Forget a key's edge. No bit changes: every other key keeps its XOR."""
        kernel.othello_remove_edge(self.arrays, kid)

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
        arr = self.arrays
        arr.words[:] = words
        arr.word_dirty[:] = 0
        kids = np.arange(n_edges, dtype=np.int64)
        half = np.empty(2 * n_edges, dtype=np.int64)
        half[0::2] = a
        half[1::2] = b
        order = np.argsort(half, kind="stable")
        sorted_nodes = half[order]
        arr.nxt[:] = -1
        same = sorted_nodes[1:] == sorted_nodes[:-1]
        arr.nxt[order[:-1][same]] = order[1:][same]
        arr.head[:] = -1
        first = np.ones(len(order), dtype=bool)
        first[1:] = ~same
        arr.head[sorted_nodes[first]] = order[first]
        arr.node[:] = -1
        arr.node[: 2 * n_edges] = half
        max_keys = len(arr.free)
        arr.free[: max_keys - n_edges] = np.arange(max_keys - 1, n_edges - 1, -1)
        arr.state[:2] = (max_keys - n_edges, 0)
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
