"""Hash placement, shared by the consistent-hashing, Chord and PlanetServe baselines.

- :class:`ChunkKeys`: a prompt's keys at the six chunk-size levels, the same-region
  lengths of the level plan (``local_min_tokens`` doubling: 128 ... 4,096 by default).
  They are the same for every region, so every edge derives the same keys, and workers
  already register their prefixes at them (they are in every region's registration
  lengths), so the index can say who holds a chunk-level prefix.
- :class:`HashRing`: a consistent-hashing ring of every worker (virtual nodes).
- :class:`ChordRing`: Chord's identifier circle over the workers, with finger tables.

Rings derive from the topology's worker ids and a fixed salt (not the run's seed, which
may differ per edge), so the objects of all edges agree without talking to each other.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

from kvcompass.hashing import GOLDEN64, MASK64, mix64
from kvcompass.index.discovery import MultiLevelQuery
from kvcompass.keys import Namespace, PrefixHasher, TokenIds, prefix_keys
from kvcompass.levels import LevelPlan
from kvcompass.topology import Topology

__all__ = ["ChordRing", "ChunkKeys", "HashRing", "node_hash"]


def node_hash(worker_id: str, salt: int) -> int:
    """A worker's 64-bit position, stable across runs and processes for one salt."""
    digest = hashlib.blake2b(worker_id.encode(), digest_size=8).digest()
    return mix64(int.from_bytes(digest, "little") ^ (salt * GOLDEN64 & MASK64))


class ChunkKeys:
    """One edge's keys of prompts at the chunk-size levels, a hasher per namespace."""

    def __init__(self, topology: Topology, plan: LevelPlan, origin_region: str) -> None:
        self.lengths = plan.queries_from(origin_region)[origin_region]
        self.regions = tuple(r.name for r in topology.regions)
        self._key_hash = plan.key_hash
        self._hashers: dict[Namespace, PrefixHasher] = {}

    def keys(self, tokens: TokenIds, namespace: Namespace) -> list[tuple[int, int]]:
        """(length, key) per level the prompt reaches, ascending. A prompt shorter than
        the first level is keyed whole: it still needs a place on the rings."""
        hasher = self._hashers.get(namespace)
        if hasher is None:
            hasher = self._hashers[namespace] = PrefixHasher(
                self.lengths, namespace, self._key_hash
            )
        keys = list(hasher.keys(tokens).items())
        if not keys:
            n = len(tokens)
            keys = [(n, prefix_keys(tokens, (n,), namespace, self._key_hash)[n])]
        return keys

    def query(self, keys: Sequence[tuple[int, int]]) -> MultiLevelQuery:
        """The index lookup of ``keys`` toward every region: who holds which level."""
        pairs = [(n, k) for n, k in keys if n in self.lengths]
        return MultiLevelQuery(dict.fromkeys(self.regions, pairs))


class HashRing:
    """Consistent hashing over every worker: a key goes to the first virtual node
    clockwise from its hash. ``salt`` makes independent rings (one per level)."""

    def __init__(self, worker_ids: Sequence[str], salt: int, vnodes: int = 64) -> None:
        self._salt = mix64(salt ^ GOLDEN64)
        points = sorted(
            (node_hash(f"{wid}#{v}", salt), w)
            for w, wid in enumerate(worker_ids)
            for v in range(vnodes)
        )
        self._points = [p for p, _ in points]
        self._owners = [w for _, w in points]

    def owner(self, key: int) -> int:
        i = bisect.bisect_left(self._points, mix64(key ^ self._salt))
        return self._owners[i % len(self._owners)]


class ChordRing:
    """Chord (Stoica et al. 2001) over the workers: node ids on a 2^64 circle, a key
    owned by its successor, lookups forwarded to the closest preceding finger."""

    def __init__(self, worker_ids: Sequence[str], salt: int) -> None:
        nodes = sorted((node_hash(wid, salt), w) for w, wid in enumerate(worker_ids))
        self._ids = [i for i, _ in nodes]
        self.workers = [w for _, w in nodes]
        self._salt = mix64(salt ^ GOLDEN64)
        n = len(nodes)
        # fingers[p]: distinct positions successor(id_p + 2^k), nearest first.
        self._fingers: list[list[int]] = []
        for p in range(n):
            found = dict.fromkeys(
                self._successor((self._ids[p] + (1 << k)) & MASK64) for k in range(64)
            )
            found.pop(p, None)
            base = self._ids[p]
            self._fingers.append(sorted(found, key=lambda q: (self._ids[q] - base) & MASK64))

    def _successor(self, ident: int) -> int:
        return bisect.bisect_left(self._ids, ident) % len(self._ids)

    def position_of(self, worker: int) -> int:
        return self.workers.index(worker)

    def key_id(self, key: int) -> int:
        return mix64(key ^ self._salt)

    def lookup(self, start: int, key: int) -> list[int]:
        """Positions a lookup of ``key`` visits from node ``start``, ending at its owner
        (recursive routing: each node forwards to its closest preceding finger)."""
        ident = self.key_id(key)
        ids = self._ids
        owner = self._successor(ident)
        path = [start]
        p = start
        while p != owner:
            to_key = (ident - ids[p]) & MASK64
            nxt = owner
            for f in reversed(self._fingers[p]):  # farthest first
                d = (ids[f] - ids[p]) & MASK64
                if d < to_key:
                    nxt = f
                    break
            path.append(nxt)
            p = nxt
        return path
